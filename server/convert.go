package server

import (
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/opledger/ledger/fingerprint"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/ledger"
)

// requestErrors collects the violations the gRPC edge finds before the
// ledger sees a request (values a proto can hold that JSON cannot).
type requestErrors []ledger.Violation

func (r *requestErrors) add(field, desc string) {
	*r = append(*r, ledger.Violation{Field: field, Description: desc})
}

func (r requestErrors) err() error {
	if len(r) == 0 {
		return nil
	}
	return &ledger.Error{Kind: ledger.KindInvalid, Violations: r}
}

// structData returns a Struct as canonical JSON (nil for a nil Struct).
func structData(field string, s *structpb.Struct, errs *requestErrors) []byte {
	if s == nil {
		return nil
	}
	m, ok := structMap(field, s, errs)
	if !ok {
		return nil
	}
	b, err := fingerprint.Canonical(m)
	if err != nil {
		errs.add(field, err.Error())
		return nil
	}
	return b
}

// structMap converts a Struct to JSON-like Go values. Unlike
// structpb.Struct.AsMap, which turns NaN and infinities into the strings
// "NaN" and "Infinity" (so they would fingerprint like those strings), it
// refuses them, and values without a kind, naming the path, never the value.
func structMap(field string, s *structpb.Struct, errs *requestErrors) (map[string]any, bool) {
	var bad string // the first problem found
	// deep reports (and records) a container nested past the limit; the
	// outermost object is level 1, as in fingerprint.Canonical.
	deep := func(level int, path string) bool {
		if level > fingerprint.MaxDepth && bad == "" {
			bad = "nested deeper than " + strconv.Itoa(fingerprint.MaxDepth) + " levels at " + strconv.Quote(path)
		}
		return bad != ""
	}
	var walk func(v *structpb.Value, path string, level int) any
	walkStruct := func(s *structpb.Struct, path string, level int) map[string]any {
		m := make(map[string]any, len(s.GetFields()))
		for k, v := range s.GetFields() {
			m[k] = walk(v, path+"/"+escapePointer(k), level+1)
		}
		return m
	}
	walk = func(v *structpb.Value, path string, level int) any {
		if bad != "" {
			return nil
		}
		switch k := v.GetKind().(type) {
		case *structpb.Value_NullValue:
			return nil
		case *structpb.Value_NumberValue:
			if math.IsNaN(k.NumberValue) || math.IsInf(k.NumberValue, 0) {
				bad = "number is NaN or infinite at " + strconv.Quote(path)
			}
			return k.NumberValue
		case *structpb.Value_StringValue:
			return k.StringValue
		case *structpb.Value_BoolValue:
			return k.BoolValue
		case *structpb.Value_StructValue:
			if deep(level, path) {
				return nil
			}
			return walkStruct(k.StructValue, path, level)
		case *structpb.Value_ListValue:
			if deep(level, path) {
				return nil
			}
			l := make([]any, len(k.ListValue.GetValues()))
			for i, e := range k.ListValue.GetValues() {
				l[i] = walk(e, path+"/"+strconv.Itoa(i), level+1)
			}
			return l
		}
		bad = "value without a kind at " + strconv.Quote(path)
		return nil
	}
	m := walkStruct(s, "", 1)
	if bad != "" {
		errs.add(field, bad)
		return nil, false
	}
	return m, true
}

// escapePointer escapes a member name as a JSON pointer token (RFC 6901).
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func fromResult(field string, r *ledgerv1.Result, errs *requestErrors) *ledger.Result {
	if r == nil {
		return nil
	}
	return &ledger.Result{Data: structData(field+".data", r.GetData(), errs), ResourceID: r.GetResourceId()}
}

func fromFailure(f *ledgerv1.Failure) *ledger.Failure {
	if f == nil {
		return nil
	}
	return &ledger.Failure{Code: f.GetCode(), Message: f.GetMessage()}
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// toProto converts a snapshot for the wire. The holder is never shown: it
// would let another caller take over the claim.
func toProto(o *ledger.Operation) *ledgerv1.Operation {
	if o == nil {
		return nil
	}
	p := &ledgerv1.Operation{
		OperationId:      o.ID,
		Tool:             o.Tool,
		Effect:           ledgerv1.Effect(o.Effect),
		State:            ledgerv1.State(o.State),
		Attempt:          o.Attempt,
		FencingToken:     o.FencingToken,
		ParamsSha256:     append([]byte(nil), o.Fingerprint[:]...),
		PermitId:         o.PermitID,
		RunId:            o.RunID,
		Step:             o.Step,
		Reason:           o.Reason,
		NeedsReview:      o.NeedsReview,
		CreatedAt:        timestamp(o.CreatedAt),
		UpdatedAt:        timestamp(o.UpdatedAt),
		LeaseExpiresAt:   timestamp(o.LeaseExpiresAt),
		UnknownSince:     timestamp(o.UnknownSince),
		RecoveryDeadline: timestamp(o.RecoveryDeadline),
		RetainUntil:      timestamp(o.RetainUntil),
		ExpiresAt:        timestamp(o.ExpiresAt),
		MaxAttempts:      o.MaxAttempts,
	}
	if o.Result != nil {
		p.Result = &ledgerv1.Result{ResourceId: o.Result.ResourceID}
		if len(o.Result.Data) > 0 {
			data := &structpb.Struct{}
			// The ledger stored canonical JSON it produced from a Struct.
			if err := protojson.Unmarshal(o.Result.Data, data); err == nil {
				p.Result.Data = data
			}
		}
	}
	if o.Failure != nil {
		p.Failure = &ledgerv1.Failure{Code: o.Failure.Code, Message: o.Failure.Message}
	}
	for _, h := range o.History {
		p.History = append(p.History, &ledgerv1.HistoryEntry{
			Time:         timestamp(h.Time),
			FromState:    ledgerv1.State(h.From),
			ToState:      ledgerv1.State(h.To),
			Attempt:      h.Attempt,
			Principal:    h.Principal,
			Reason:       h.Reason,
			FencingToken: h.FencingToken,
			Detail:       h.Detail,
		})
	}
	return p
}
