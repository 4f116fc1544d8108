package server

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/chain"
	"github.com/opledger/ledger/fingerprint"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/ledger"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestStructMapRefusals pins what structMap refuses and how it names the
// place: a JSON pointer to the value (RFC 6901 escapes), never the value.
func TestStructMapRefusals(t *testing.T) {
	nan := structpb.NewNumberValue(math.NaN())
	list := func(v ...*structpb.Value) *structpb.Value {
		return structpb.NewListValue(&structpb.ListValue{Values: v})
	}
	obj := func(k string, v *structpb.Value) *structpb.Value {
		return structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{k: v}})
	}
	deep := structpb.NewNullValue()
	for range 70 {
		deep = obj("x", deep)
	}
	cases := []struct {
		name string
		in   *structpb.Value
		want string
	}{
		{"NaN", obj("a", obj("b~/c", list(structpb.NewNumberValue(1), nan))), `number is NaN or infinite at "/a/b~0~1c/1"`},
		{"infinity", obj("", structpb.NewNumberValue(math.Inf(-1))), `number is NaN or infinite at "/"`},
		{"no kind", obj("x", list(structpb.NewNullValue(), &structpb.Value{})), `value without a kind at "/x/1"`},
		{"too deep", deep, `nested deeper than 64 levels at "` + strings.Repeat("/x", 64) + `"`},
		{"the first problem by name", structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"b": nan, "a": obj("", &structpb.Value{}), "c": structpb.NewStringValue("ok"), "d": obj("e", nan),
		}}), `value without a kind at "/a/"`},
	}
	for _, c := range cases {
		// Maps are walked in random order: the answer must not follow it.
		for range 20 {
			var errs requestErrors
			m, ok := structMap("params", c.in.GetStructValue(), &errs)
			if ok || m != nil || len(errs) != 1 || errs[0].Field != "params" {
				t.Fatalf("%s: %v, %v, %v", c.name, m, ok, errs)
			}
			if errs[0].Description != c.want {
				t.Fatalf("%s: %q, want %q", c.name, errs[0].Description, c.want)
			}
		}
	}
}

// FuzzStructParams: for any Struct a client can send as JSON, the edge's
// conversion never panics, agrees with structpb's own conversion (JSON holds
// no NaN or infinity, the one place they differ), and fingerprints the same.
func FuzzStructParams(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"amount":42,"currency":"EUR"}`, `{"a":{"b":[1,2,{"c":null}]}}`,
		`{"x":1e308,"y":-0,"z":5e-324}`, `{"k~/":"v","":true}`, `{"€":"\u2028"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &structpb.Struct{}
		if err := protojson.Unmarshal(data, s); err != nil {
			return
		}
		var errs requestErrors
		m, ok := structMap("params", s, &errs)
		if !ok {
			if len(errs) != 1 || !bytes.Contains([]byte(errs[0].Description), []byte("nested deeper")) {
				t.Fatalf("refused %s: %v", data, errs)
			}
			return
		}
		if want := s.AsMap(); !reflect.DeepEqual(m, want) {
			t.Fatalf("structMap(%s) = %v, AsMap = %v", data, m, want)
		}
		a, errA := fingerprint.Canonical(m)
		b, errB := fingerprint.Canonical(s.AsMap())
		if (errA == nil) != (errB == nil) || !bytes.Equal(a, b) {
			t.Fatalf("canonical forms differ: %s / %s (%v, %v)", a, b, errA, errB)
		}
	})
}

// TestToProto: every field of a snapshot reaches the wire under its own
// name, the enums keep their numbers, and the holder never leaves.
func TestToProto(t *testing.T) {
	at := func(ms int64) time.Time { return time.UnixMilli(1_790_000_000_000 + ms).UTC() }
	ts := func(ms int64) *timestamppb.Timestamp { return timestamppb.New(at(ms)) }
	var fp fingerprint.Fingerprint
	fp[0], fp[31] = 0xab, 0xcd
	data, err := structpb.NewStruct(map[string]any{"receipt": "R-1", "n": 2})
	if err != nil {
		t.Fatal(err)
	}
	// The history case's chain, from the wire's fields (docs/receipts.md, "The history chain").
	head := chain.Head("", []chain.Entry{
		{TimeMillis: at(0).UnixMilli(), From: 0, To: 2, Reason: "RESERVED", Attempt: 1, FencingToken: 8, Principal: "agent-1"},
		{TimeMillis: at(10).UnixMilli(), From: 1, To: 5, Reason: "MARKED_UNKNOWN", Attempt: 2, FencingToken: 9, Principal: "agent-1", Detail: "timeout"},
		{TimeMillis: at(20).UnixMilli(), From: 5, To: 5, Reason: "ESCALATED", Attempt: 2, FencingToken: 9, Principal: "ops", Detail: "INC-1"},
	})
	cases := []struct {
		name string
		in   *ledger.Operation
		want *ledgerv1.Operation
	}{
		{"nil", nil, nil},
		{"RUNNING", &ledger.Operation{ID: "op-1", Tool: "payments.refund", Effect: ledger.EffectIrreversible, State: ledger.StateRunning,
			Attempt: 1, FencingToken: 7, Fingerprint: fp, PermitID: "permit-1", RunID: "run-1", Step: 3, Holder: "h-secret",
			Reason: "RESERVED", CreatedAt: at(0), UpdatedAt: at(0), LeaseExpiresAt: at(30_000), RetainUntil: at(90_000), MaxAttempts: 3},
			&ledgerv1.Operation{OperationId: "op-1", Tool: "payments.refund", Effect: ledgerv1.Effect_EFFECT_IRREVERSIBLE,
				State: ledgerv1.State_STATE_RUNNING, Attempt: 1, FencingToken: 7, ParamsSha256: fp[:], PermitId: "permit-1", RunId: "run-1",
				Step: 3, Reason: "RESERVED", CreatedAt: ts(0), UpdatedAt: ts(0), LeaseExpiresAt: ts(30_000), RetainUntil: ts(90_000), MaxAttempts: 3}},
		{"UNKNOWN, escalated, with history", &ledger.Operation{ID: "op-2", Tool: "t", Effect: ledger.EffectIdempotent, State: ledger.StateUnknown,
			Attempt: 2, FencingToken: 9, Fingerprint: fp, Reason: "ESCALATED", NeedsReview: true, Failure: &ledger.Failure{Code: "503"},
			CreatedAt: at(0), UpdatedAt: at(20), UnknownSince: at(10), RecoveryDeadline: at(900_010), MaxAttempts: 3,
			History: []ledger.HistoryEntry{
				{Time: at(0), From: ledger.StateUnspecified, To: ledger.StateRunning, Attempt: 1, FencingToken: 8, Principal: "agent-1", Reason: "RESERVED"},
				{Time: at(10), From: ledger.StatePending, To: ledger.StateUnknown, Attempt: 2, FencingToken: 9, Principal: "agent-1", Reason: "MARKED_UNKNOWN", Detail: "timeout"},
				{Time: at(20), From: ledger.StateUnknown, To: ledger.StateUnknown, Attempt: 2, FencingToken: 9, Principal: "ops", Reason: "ESCALATED", Detail: "INC-1"},
			}},
			&ledgerv1.Operation{OperationId: "op-2", Tool: "t", Effect: ledgerv1.Effect_EFFECT_IDEMPOTENT, State: ledgerv1.State_STATE_UNKNOWN,
				Attempt: 2, FencingToken: 9, ParamsSha256: fp[:], Reason: "ESCALATED", NeedsReview: true, Failure: &ledgerv1.Failure{Code: "503"},
				CreatedAt: ts(0), UpdatedAt: ts(20), UnknownSince: ts(10), RecoveryDeadline: ts(900_010), MaxAttempts: 3,
				HistoryBase: chain.Genesis, HistoryHead: head,
				History: []*ledgerv1.HistoryEntry{
					{Time: ts(0), FromState: ledgerv1.State_STATE_UNSPECIFIED, ToState: ledgerv1.State_STATE_RUNNING, Attempt: 1, FencingToken: 8, Principal: "agent-1", Reason: "RESERVED"},
					{Time: ts(10), FromState: ledgerv1.State_STATE_PENDING, ToState: ledgerv1.State_STATE_UNKNOWN, Attempt: 2, FencingToken: 9, Principal: "agent-1", Reason: "MARKED_UNKNOWN", Detail: "timeout"},
					{Time: ts(20), FromState: ledgerv1.State_STATE_UNKNOWN, ToState: ledgerv1.State_STATE_UNKNOWN, Attempt: 2, FencingToken: 9, Principal: "ops", Reason: "ESCALATED", Detail: "INC-1"},
				}}},
		{"SUCCEEDED, a compensation and compensated", &ledger.Operation{ID: "op-3", Tool: "t", Effect: ledger.EffectReadOnly, State: ledger.StateSucceeded, Attempt: 1,
			FencingToken: 5, Fingerprint: fp, Reason: "SUCCEEDED", Result: &ledger.Result{ResourceID: "R-1", Data: []byte(`{"n":2,"receipt":"R-1"}`)},
			CreatedAt: at(0), UpdatedAt: at(5), ExpiresAt: at(86_400_005), MaxAttempts: 3,
			Compensates: "op-0", CompensatedBy: []string{"op-5", "op-6"}},
			&ledgerv1.Operation{OperationId: "op-3", Tool: "t", Effect: ledgerv1.Effect_EFFECT_READ_ONLY, State: ledgerv1.State_STATE_SUCCEEDED,
				Attempt: 1, FencingToken: 5, ParamsSha256: fp[:], Reason: "SUCCEEDED", Result: &ledgerv1.Result{ResourceId: "R-1", Data: data},
				CreatedAt: ts(0), UpdatedAt: ts(5), ExpiresAt: ts(86_400_005), MaxAttempts: 3,
				Compensates: "op-0", CompensatedBy: []string{"op-5", "op-6"}}},
		{"FAILED_FINAL", &ledger.Operation{ID: "op-4", Tool: "t", Effect: ledger.EffectIrreversible, State: ledger.StateFailedFinal, Attempt: 3,
			FencingToken: 6, Fingerprint: fp, Reason: "RETRIES_EXHAUSTED", Failure: &ledger.Failure{Code: "RETRIES_EXHAUSTED", Message: "3 attempts"},
			CreatedAt: at(0), UpdatedAt: at(5), ExpiresAt: at(6), MaxAttempts: 3},
			&ledgerv1.Operation{OperationId: "op-4", Tool: "t", Effect: ledgerv1.Effect_EFFECT_IRREVERSIBLE, State: ledgerv1.State_STATE_FAILED_FINAL,
				Attempt: 3, FencingToken: 6, ParamsSha256: fp[:], Reason: "RETRIES_EXHAUSTED",
				Failure:   &ledgerv1.Failure{Code: "RETRIES_EXHAUSTED", Message: "3 attempts"},
				CreatedAt: ts(0), UpdatedAt: ts(5), ExpiresAt: ts(6), MaxAttempts: 3}},
		{"FAILED_FINAL with a detail", &ledger.Operation{ID: "op-5", Tool: "t", State: ledger.StateFailedFinal, Attempt: 1,
			FencingToken: 7, Fingerprint: fp, Reason: "FAILED_FINAL", Failure: &ledger.Failure{Code: "tool_error", Detail: "card 4242 declined"},
			CreatedAt: at(0), UpdatedAt: at(5), ExpiresAt: at(6), MaxAttempts: 3},
			&ledgerv1.Operation{OperationId: "op-5", Tool: "t", State: ledgerv1.State_STATE_FAILED_FINAL,
				Attempt: 1, FencingToken: 7, ParamsSha256: fp[:], Reason: "FAILED_FINAL",
				Failure:   &ledgerv1.Failure{Code: "tool_error", Detail: "card 4242 declined"},
				CreatedAt: ts(0), UpdatedAt: ts(5), ExpiresAt: ts(6), MaxAttempts: 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The result's data is in wire form only: compare what a
			// client decodes.
			var err error
			got := toProto(c.in)
			if got != nil {
				got = &ledgerv1.Operation{}
				err = proto.Unmarshal(wireOf(t, toProto(c.in)), got)
			}
			if err != nil || !proto.Equal(got, c.want) {
				t.Fatalf("toProto =\n%v (%v)\nwant\n%v", got, err, c.want)
			}
		})
	}
}

// BenchmarkCompleteConversions: the edge's work on a Complete with a
// 100-byte result, without the ledger call: the request decoded by the
// service's codec and its result converted, and a SUCCEEDED snapshot
// converted and encoded for the reply.
//
//	go test -run '^$' -bench CompleteConversions -benchmem ./server
func BenchmarkCompleteConversions(b *testing.B) {
	codec := newRequestCodec(1 << 20)
	data, err := structpb.NewStruct(map[string]any{"id": strings.Repeat("r", 91)})
	if err != nil {
		b.Fatal(err)
	}
	wire := wireOf(b, &ledgerv1.CompleteRequest{OperationId: "wf-0000000001:refund", FencingToken: 1790000000123,
		Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{Data: data}})
	b.Run("request", func(b *testing.B) {
		for b.Loop() {
			var req ledgerv1.CompleteRequest
			var errs requestErrors
			if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &req); err != nil {
				b.Fatal(err)
			}
			if r, bad := fromResult("result", req.GetResult(), "ledger.v1.CompleteRequest", &errs); r == nil || bad != "" || len(errs) > 0 {
				b.Fatal(bad, errs)
			}
		}
	})
	now := time.UnixMilli(1790000000123)
	o := &ledger.Operation{ID: "wf-0000000001:refund", Tool: "payments.refund", State: ledger.StateSucceeded, Attempt: 1,
		FencingToken: 1790000000123, CreatedAt: now, UpdatedAt: now, RetainUntil: now, ExpiresAt: now, MaxAttempts: 3,
		Result: &ledger.Result{Data: []byte(`{"id":"` + strings.Repeat("r", 91) + `"}`)}}
	b.Run("response", func(b *testing.B) {
		for b.Loop() {
			out, err := codec.Marshal(&ledgerv1.CompleteResponse{Operation: toProto(o)})
			if err != nil {
				b.Fatal(err)
			}
			out.Free()
		}
	})
}
