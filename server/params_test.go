package server

import (
	"math"
	"reflect"
	"strings"
	"testing"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// wireOf returns the wire bytes of m.
func wireOf(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// field appends a length-delimited field.
func field(b []byte, num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

// entry is a Struct's field: the map entry of key and the Value bytes v.
func entry(key string, v []byte) []byte {
	return field(nil, structFields, field(field(nil, entryKey, []byte(key)), entryValue, v))
}

// stringValue is a Value's bytes holding s.
func stringValue(s string) []byte { return field(nil, valueString, []byte(s)) }

// withParams is a ReserveRequest's bytes with params as the Struct bytes p.
func withParams(tb testing.TB, p []byte) []byte {
	head := wireOf(tb, &ledgerv1.ReserveRequest{OperationId: "op", Tool: "payments.refund"})
	return append(field(head, paramsField, p), wireOf(tb, &ledgerv1.ReserveRequest{Holder: "h"})...)
}

// reserveRequestCases are ReserveRequests' wire bytes: whether the codec
// leaves the params encoded, and what the handler then makes of them (Go
// values, or the description of undecodable params, or of a field
// violation).
func reserveRequestCases(tb testing.TB) []struct {
	name      string
	wire      []byte
	encoded   bool // the codec leaves the params encoded
	direct    bool // and the handler reads them without protobuf
	params    map[string]any
	bad, errs string
} {
	refund, err := structpb.NewStruct(map[string]any{
		"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250, "currency": "eur", "reason": "requested_by_customer",
	})
	if err != nil {
		tb.Fatal(err)
	}
	nested, err := structpb.NewStruct(map[string]any{"a": map[string]any{"b": []any{1.5, true, nil, "x", []any{}, map[string]any{}}}, "": math.Copysign(0, -1)})
	if err != nil {
		tb.Fatal(err)
	}
	deep := stringValue("x")
	for range 64 {
		deep = field(nil, valueStruct, entry("x", deep))
	}
	nan := protowire.AppendFixed64(protowire.AppendTag(nil, valueNumber, protowire.Fixed64Type), math.Float64bits(math.NaN()))
	return []struct {
		name      string
		wire      []byte
		encoded   bool
		direct    bool
		params    map[string]any
		bad, errs string
	}{
		{name: "refund", wire: wireOf(tb, &ledgerv1.ReserveRequest{OperationId: "op", Tool: "t", Params: refund, Holder: "h"}), encoded: true, direct: true,
			params: map[string]any{"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250.0, "currency": "eur", "reason": "requested_by_customer"}},
		{name: "nested", wire: wireOf(tb, &ledgerv1.ReserveRequest{OperationId: "op", Params: nested}), encoded: true, direct: true,
			params: map[string]any{"a": map[string]any{"b": []any{1.5, true, nil, "x", []any{}, map[string]any{}}}, "": math.Copysign(0, -1)}},
		{name: "no params", wire: wireOf(tb, &ledgerv1.ReserveRequest{OperationId: "op", ParamsSha256: make([]byte, 32)})},
		{name: "empty params", wire: wireOf(tb, &ledgerv1.ReserveRequest{OperationId: "op", Params: &structpb.Struct{}}), encoded: true, direct: true, params: map[string]any{}},
		{name: "params twice: merged", wire: field(withParams(tb, entry("a", stringValue("1"))), paramsField, entry("b", stringValue("2"))),
			params: map[string]any{"a": "1", "b": "2"}},
		{name: "a key twice: the last", wire: withParams(tb, append(entry("a", stringValue("1")), entry("a", stringValue("2"))...)), encoded: true,
			params: map[string]any{"a": "2"}},
		{name: "two kinds: the last", wire: withParams(tb, entry("a", append(stringValue("1"), protowire.AppendVarint(protowire.AppendTag(nil, valueBool, protowire.VarintType), 1)...))),
			encoded: true, params: map[string]any{"a": true}},
		{name: "an unknown field", wire: withParams(tb, append(entry("a", stringValue("1")), field(nil, 9, []byte("?"))...)), encoded: true,
			params: map[string]any{"a": "1"}},
		{name: "a key not UTF-8", wire: withParams(tb, entry("\xff", stringValue("1"))), encoded: true, bad: "a string field is not valid UTF-8"},
		{name: "a value not UTF-8", wire: withParams(tb, entry("a", stringValue("\xfe"))), encoded: true, bad: "a string field is not valid UTF-8"},
		{name: "params not a Struct", wire: withParams(tb, []byte{0xff, 0xff}), encoded: true, bad: "not a valid ledger.v1.ReserveRequest message"},
		{name: "NaN", wire: withParams(tb, entry("a", nan)), encoded: true, errs: `params: number is NaN or infinite at "/a"`},
		{name: "no kind", wire: withParams(tb, entry("a", nil)), encoded: true, errs: `params: value without a kind at "/a"`},
		{name: "too deep", wire: withParams(tb, entry("x", deep)), encoded: true,
			errs: `params: nested deeper than 64 levels at "` + strings.Repeat("/x", 64) + `"`},
	}
}

// TestUnmarshalReserve: what the codec and the handler make of a Reserve's
// params, against the cases' expectations and against decoding the whole
// request with protobuf (checkReserveDecoding).
func TestUnmarshalReserve(t *testing.T) {
	for _, c := range reserveRequestCases(t) {
		var req ledgerv1.ReserveRequest
		if err := unmarshalReserve(c.wire, &req); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if encoded := req.GetParams() == nil && len(req.ProtoReflect().GetUnknown()) > 0; encoded != c.encoded {
			t.Errorf("%s: params left encoded %v, want %v", c.name, encoded, c.encoded)
		}
		raw, ok := keptBytes(&req, paramsField)
		if _, direct := decodeStruct(raw, 1); (ok && direct) != c.direct {
			t.Errorf("%s: read directly %v, want %v", c.name, direct, c.direct)
		}
		var errs requestErrors
		params, bad := reserveParams(&req, &errs)
		if bad != c.bad || !reflect.DeepEqual(params, c.params) || errsText(errs) != c.errs {
			t.Errorf("%s: %v, %q, %q; want %v, %q, %q", c.name, params, bad, errsText(errs), c.params, c.bad, c.errs)
		}
		checkReserveDecoding(t, c.wire)
	}
}

func errsText(errs requestErrors) string {
	var s []string
	for _, e := range errs {
		s = append(s, e.Field+": "+e.Description)
	}
	return strings.Join(s, "; ")
}

// checkReserveDecoding requires that unmarshalReserve and reserveParams
// give what proto.Unmarshal of the whole request and structMap give: the
// same fields, the same params or refusal, the same bytes when marshalled
// again; where protobuf refuses the request, a refusal by either.
func checkReserveDecoding(t *testing.T, wire []byte) {
	t.Helper()
	var want ledgerv1.ReserveRequest
	wantErr := proto.Unmarshal(wire, &want)
	var got ledgerv1.ReserveRequest
	if err := unmarshalReserve(wire, &got); err != nil {
		if wantErr == nil {
			t.Fatalf("%x: refused (%v), protobuf takes it", wire, err)
		}
		return
	}
	var gotErrs, wantErrs requestErrors
	params, bad := reserveParams(&got, &gotErrs)
	if wantErr != nil {
		if bad != decodeDesc(wantErr, "ledger.v1.ReserveRequest") {
			t.Fatalf("%x: params %v (%q), protobuf: %v", wire, params, bad, wantErr)
		}
		return
	}
	if bad != "" {
		t.Fatalf("%x: params undecodable (%s), protobuf takes them", wire, bad)
	}
	var wantParams map[string]any
	if want.GetParams() != nil {
		wantParams, _ = structMap("params", want.GetParams(), &wantErrs)
	}
	if !reflect.DeepEqual(params, wantParams) || errsText(gotErrs) != errsText(wantErrs) {
		t.Fatalf("%x: %v %q, protobuf: %v %q", wire, params, errsText(gotErrs), wantParams, errsText(wantErrs))
	}
	var again ledgerv1.ReserveRequest
	if err := proto.Unmarshal(wireOf(t, &got), &again); err != nil || !proto.Equal(&again, &want) {
		t.Fatalf("%x: marshalled again it decodes to %v (%v), want %v", wire, &again, err, &want)
	}
	got.Params, want.Params = nil, nil
	got.ProtoReflect().SetUnknown(nil)
	want.ProtoReflect().SetUnknown(nil)
	if !proto.Equal(&got, &want) {
		t.Fatalf("%x: fields %v, want %v", wire, &got, &want)
	}
}

// FuzzUnmarshalReserve: for any bytes, the codec's decoding of a Reserve
// and the handler's reading of its params agree with protobuf's decoding
// of the whole request (checkReserveDecoding).
func FuzzUnmarshalReserve(f *testing.F) {
	for _, c := range reserveRequestCases(f) {
		f.Add(c.wire)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		checkReserveDecoding(t, wire)
	})
}

// FuzzDecodeStruct: whatever Struct bytes the direct reading takes,
// protobuf takes too, and structMap gives the same values without a
// refusal.
func FuzzDecodeStruct(f *testing.F) {
	for _, c := range reserveRequestCases(f) {
		var req ledgerv1.ReserveRequest
		if unmarshalReserve(c.wire, &req) == nil {
			if raw, ok := keptBytes(&req, paramsField); ok {
				f.Add(raw)
			}
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		m, ok := decodeStruct(raw, 1)
		if !ok {
			return
		}
		var s structpb.Struct
		if err := proto.Unmarshal(raw, &s); err != nil {
			t.Fatalf("%x: taken, protobuf refuses it: %v", raw, err)
		}
		var errs requestErrors
		want, _ := structMap("params", &s, &errs)
		if len(errs) > 0 || !reflect.DeepEqual(m, want) {
			t.Fatalf("%x: %v, structMap %v %v", raw, m, want, errs)
		}
	})
}

// completeRequestCases are CompleteRequests' wire bytes: whether the codec
// leaves the result's data encoded, whether it refuses the request, and
// what the handler makes of the result (its data as canonical JSON, or the
// description of undecodable data, or of a field violation).
func completeRequestCases(tb testing.TB) []struct {
	name       string
	wire       []byte
	encoded    bool // the codec leaves the data encoded
	refused    bool // the codec refuses the request
	data       string
	bad, errs  string
	resourceID string
} {
	receipt, err := structpb.NewStruct(map[string]any{"id": strings.Repeat("r", 91), "amount": 1250, "ok": true})
	if err != nil {
		tb.Fatal(err)
	}
	head := wireOf(tb, &ledgerv1.CompleteRequest{OperationId: "op", FencingToken: 7, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED})
	withResult := func(r []byte) []byte { return field(append([]byte(nil), head...), resultField, r) }
	withData := func(d []byte) []byte { return withResult(field(nil, resultDataField, d)) }
	nan := protowire.AppendFixed64(protowire.AppendTag(nil, valueNumber, protowire.Fixed64Type), math.Float64bits(math.NaN()))
	return []struct {
		name       string
		wire       []byte
		encoded    bool
		refused    bool
		data       string
		bad, errs  string
		resourceID string
	}{
		{name: "receipt", wire: wireOf(tb, &ledgerv1.CompleteRequest{OperationId: "op", FencingToken: 7, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED,
			Result: &ledgerv1.Result{Data: receipt, ResourceId: "re_1"}}), encoded: true,
			data: `{"amount":1250,"id":"` + strings.Repeat("r", 91) + `","ok":true}`, resourceID: "re_1"},
		{name: "no result", wire: head},
		{name: "no data", wire: withResult(field(nil, 2, []byte("re_2"))), resourceID: "re_2"},
		{name: "empty data", wire: withData(nil), encoded: true, data: `{}`},
		{name: "data after the resource id", wire: withResult(append(field(nil, 2, []byte("re_3")), field(nil, resultDataField, entry("a", stringValue("1")))...)),
			encoded: true, data: `{"a":"1"}`, resourceID: "re_3"},
		{name: "result twice: merged", wire: field(withData(entry("a", stringValue("1"))), resultField, field(nil, 2, []byte("re_4"))),
			data: `{"a":"1"}`, resourceID: "re_4"},
		{name: "data twice: merged", wire: withResult(append(field(nil, resultDataField, entry("a", stringValue("1"))), field(nil, resultDataField, entry("b", stringValue("2")))...)),
			data: `{"a":"1","b":"2"}`},
		{name: "a key not UTF-8", wire: withData(entry("\xff", stringValue("1"))), encoded: true, bad: "a string field is not valid UTF-8"},
		{name: "data not a Struct", wire: withData([]byte{0xff, 0xff}), encoded: true, bad: "not a valid ledger.v1.CompleteRequest message"},
		{name: "resource id not UTF-8", wire: withResult(append(field(nil, resultDataField, nil), field(nil, 2, []byte("\xfe"))...)), refused: true},
		{name: "result not a Result", wire: withResult([]byte{0xff}), refused: true},
		{name: "NaN", wire: withData(entry("a", nan)), encoded: true, errs: `result.data: number is NaN or infinite at "/a"`},
	}
}

// TestUnmarshalComplete: what the codec and the handler make of a
// Complete's result, against the cases' expectations and against decoding
// the whole request with protobuf (checkCompleteDecoding).
func TestUnmarshalComplete(t *testing.T) {
	for _, c := range completeRequestCases(t) {
		var req ledgerv1.CompleteRequest
		if err := unmarshalComplete(c.wire, &req); (err != nil) != c.refused {
			t.Fatalf("%s: refused %v, want %v", c.name, err, c.refused)
		}
		checkCompleteDecoding(t, c.wire)
		if c.refused {
			continue
		}
		_, kept := keptBytes(req.GetResult(), resultDataField)
		if encoded := kept && req.GetResult().GetData() == nil; encoded != c.encoded {
			t.Errorf("%s: data left encoded %v, want %v", c.name, encoded, c.encoded)
		}
		var errs requestErrors
		r, bad := fromResult("result", req.GetResult(), "ledger.v1.CompleteRequest", &errs)
		var data, resourceID string
		if r != nil {
			data, resourceID = string(r.Data), r.ResourceID
		}
		if data != c.data || resourceID != c.resourceID || bad != c.bad || errsText(errs) != c.errs {
			t.Errorf("%s: %s %q, %q, %q; want %s %q, %q, %q", c.name, data, resourceID, bad, errsText(errs), c.data, c.resourceID, c.bad, c.errs)
		}
	}
}

// checkCompleteDecoding requires that unmarshalComplete and fromResult give
// what proto.Unmarshal of the whole request gives: the same fields, the
// same result or refusal, the same request when marshalled again.
func checkCompleteDecoding(t *testing.T, wire []byte) {
	t.Helper()
	const msg = "ledger.v1.CompleteRequest"
	var want ledgerv1.CompleteRequest
	wantErr := proto.Unmarshal(wire, &want)
	var got ledgerv1.CompleteRequest
	if err := unmarshalComplete(wire, &got); err != nil {
		if wantErr == nil {
			t.Fatalf("%x: refused (%v), protobuf takes it", wire, err)
		}
		return
	}
	var gotErrs, wantErrs requestErrors
	result, bad := fromResult("result", got.GetResult(), msg, &gotErrs)
	if wantErr != nil {
		if bad != decodeDesc(wantErr, msg) {
			t.Fatalf("%x: result %v (%q), protobuf: %v", wire, result, bad, wantErr)
		}
		return
	}
	if bad != "" {
		t.Fatalf("%x: result undecodable (%s), protobuf takes it", wire, bad)
	}
	wantResult, _ := fromResult("result", want.GetResult(), msg, &wantErrs)
	if !reflect.DeepEqual(result, wantResult) || errsText(gotErrs) != errsText(wantErrs) {
		t.Fatalf("%x: %v %q, protobuf: %v %q", wire, result, errsText(gotErrs), wantResult, errsText(wantErrs))
	}
	var again ledgerv1.CompleteRequest
	if err := proto.Unmarshal(wireOf(t, &got), &again); err != nil || !proto.Equal(&again, &want) {
		t.Fatalf("%x: marshalled again it decodes to %v (%v), want %v", wire, &again, err, &want)
	}
	for _, r := range []*ledgerv1.Result{got.GetResult(), want.GetResult()} {
		if r != nil {
			r.Data = nil
			r.ProtoReflect().SetUnknown(nil)
		}
	}
	if !proto.Equal(&got, &want) {
		t.Fatalf("%x: fields %v, want %v", wire, &got, &want)
	}
}

// FuzzUnmarshalComplete: for any bytes, the codec's decoding of a Complete
// and the handler's reading of its result agree with protobuf's decoding
// of the whole request (checkCompleteDecoding).
func FuzzUnmarshalComplete(f *testing.F) {
	for _, c := range completeRequestCases(f) {
		f.Add(c.wire)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		checkCompleteDecoding(t, wire)
	})
}

// BenchmarkReserveParams decodes the benchmark's refund request and reads
// its params into Go values: by protobuf and structMap, and by the codec
// and reserveParams.
//
//	go test -run '^$' -bench ReserveParams -benchmem ./server
func BenchmarkReserveParams(b *testing.B) {
	wire := reserveRequestCases(b)[0].wire
	b.Run("protobuf", func(b *testing.B) {
		for b.Loop() {
			var req ledgerv1.ReserveRequest
			var errs requestErrors
			if proto.Unmarshal(wire, &req) != nil {
				b.Fatal("refused")
			}
			if _, ok := structMap("params", req.GetParams(), &errs); !ok {
				b.Fatal(errs)
			}
		}
	})
	b.Run("codec", func(b *testing.B) {
		for b.Loop() {
			var req ledgerv1.ReserveRequest
			var errs requestErrors
			if unmarshalReserve(wire, &req) != nil {
				b.Fatal("refused")
			}
			if p, bad := reserveParams(&req, &errs); p == nil || bad != "" || len(errs) > 0 {
				b.Fatal(bad, errs)
			}
		}
	})
}
