package server

import (
	"math"
	"unicode/utf8"

	"github.com/opledger/ledger/fingerprint"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// A Reserve's params and a Complete's result data arrive as a
// google.protobuf.Struct, whose generic decoding (a map of messages, a
// oneof per value) was most of the cost of decoding the request. The codec
// leaves them encoded instead (unmarshalReserve, unmarshalComplete), and
// the handler reads them straight into the Go values the ledger takes
// (keptStruct). docs/benchmarks.md, sections 6.12 and 6.13.

// Field numbers of ReserveRequest.params, CompleteRequest.result, and of
// google.protobuf.Struct, its map entries, Value and ListValue.
const (
	paramsField  protowire.Number = 3
	resultField  protowire.Number = 4
	structFields protowire.Number = 1
	entryKey     protowire.Number = 1
	entryValue   protowire.Number = 2
	valueNull    protowire.Number = 1
	valueNumber  protowire.Number = 2
	valueString  protowire.Number = 3
	valueBool    protowire.Number = 4
	valueStruct  protowire.Number = 5
	valueList    protowire.Number = 6
	listValues   protowire.Number = 1
	paramsDepth                   = fingerprint.MaxDepth
)

// unmarshalReserve decodes b into req as proto.Unmarshal does, but for a
// params field that occurs once: its bytes are kept, as they came, as the
// message's unknown field 3 (so req marshals to the same bytes) and
// GetParams is nil.
func unmarshalReserve(b []byte, req *ledgerv1.ReserveRequest) error {
	return unmarshalAround(b, req, paramsField, keepUnknown(req))
}

// unmarshalComplete decodes b into req as proto.Unmarshal does, but for a
// result field that occurs once, whose data field, if it occurs once, is
// kept so (unknown field 1 of the Result, GetData nil).
func unmarshalComplete(b []byte, req *ledgerv1.CompleteRequest) error {
	return unmarshalAround(b, req, resultField, func(_, v []byte) error {
		r := &ledgerv1.Result{}
		if err := unmarshalAround(v, r, resultDataField, keepUnknown(r)); err != nil {
			return err
		}
		req.Result = r
		return nil
	})
}

// unmarshalAround decodes b into m as proto.Unmarshal does, except for the
// one length-delimited field num, which goes to keep (the field with its
// tag, and its value). When b is malformed or has no field num or more
// than one, all of it goes to proto.Unmarshal.
func unmarshalAround(b []byte, m proto.Message, num protowire.Number, keep func(field, value []byte) error) error {
	start, end := fieldSpan(b, num)
	if start < 0 {
		return proto.Unmarshal(b, m)
	}
	if start > 0 {
		if err := proto.Unmarshal(b[:start], m); err != nil {
			return err
		}
	}
	if end < len(b) {
		if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(b[end:], m); err != nil {
			return err
		}
	}
	_, _, n := protowire.ConsumeTag(b[start:])
	v, _ := protowire.ConsumeBytes(b[start+n : end])
	return keep(b[start:end], v)
}

// keepUnknown returns a keep function of unmarshalAround that adds the
// field to m's unknown fields.
func keepUnknown(m proto.Message) func(field, value []byte) error {
	return func(field, _ []byte) error {
		r := m.ProtoReflect()
		r.SetUnknown(append(r.GetUnknown(), field...))
		return nil
	}
}

// fieldSpan returns where the one field num of a message's wire bytes
// starts and ends (tag included); -1 when b is malformed or has no field
// num, one that is not length-delimited, or more than one.
func fieldSpan(b []byte, field protowire.Number) (start, end int) {
	start = -1
	for at := 0; at < len(b); {
		num, typ, n := protowire.ConsumeTag(b[at:])
		if n < 0 {
			return -1, -1
		}
		m := protowire.ConsumeFieldValue(num, typ, b[at+n:])
		if m < 0 {
			return -1, -1
		}
		if num == field {
			if start >= 0 || typ != protowire.BytesType {
				return -1, -1
			}
			start, end = at, at+n+m
		}
		at += n + m
	}
	return start, end
}

// keptBytes returns the value of the field num that unmarshalAround kept
// among m's unknown fields.
func keptBytes(m proto.Message, field protowire.Number) ([]byte, bool) {
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		if num == field && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b[n:])
			return v, m >= 0
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, false
		}
		b = b[n+m:]
	}
	return nil, false
}

// reserveParams returns a Reserve's params as Go values (nil when it has
// none), or adds what is wrong with them to errs; bad as keptStruct.
func reserveParams(req *ledgerv1.ReserveRequest, errs *requestErrors) (params map[string]any, bad string) {
	return keptStruct("params", req.GetParams(), req, paramsField, "ledger.v1.ReserveRequest", errs)
}

// keptStruct returns the Struct field num of m as Go values: s when the
// codec decoded it, else the bytes it kept (keptBytes); nil when m has
// neither. What is wrong with the values is added to errs under field.
// bad is the description of kept bytes that are no valid Struct (the
// request, a msg, then gets the answer of a request the codec could not
// decode).
func keptStruct(field string, s *structpb.Struct, m proto.Message, num protowire.Number, msg string, errs *requestErrors) (values map[string]any, bad string) {
	if s != nil {
		values, _ = structMap(field, s, errs)
		return values, ""
	}
	raw, ok := keptBytes(m, num)
	if !ok {
		return nil, ""
	}
	if v, ok := decodeStruct(raw, 1); ok {
		return v, ""
	}
	// What the direct reading does not take (a problem, or a form it
	// leaves to protobuf) goes the general way, with its messages.
	var decoded structpb.Struct
	if err := proto.Unmarshal(raw, &decoded); err != nil {
		return nil, decodeDesc(err, msg)
	}
	values, _ = structMap(field, &decoded, errs)
	return values, ""
}

// decodeStruct reads a Struct's wire bytes at nesting level into the
// values structMap gives, when the Struct is valid and in the form
// protobuf writes: each map key once, each field of an entry or a value
// at most once, no unknown fields, valid UTF-8, no NaN or infinity, every
// value with a kind, nesting within paramsDepth. Anything else: false.
func decodeStruct(b []byte, level int) (map[string]any, bool) {
	m := make(map[string]any, countEntries(b))
	for len(b) > 0 {
		entry, rest, _ := nextBytes(b, structFields)
		b = rest
		k, v, ok := decodeEntry(entry, level)
		if !ok {
			return nil, false
		}
		if _, dup := m[k]; dup {
			return nil, false
		}
		m[k] = v
	}
	return m, true
}

// decodeEntry reads a map entry of a Struct: its key and value.
func decodeEntry(b []byte, level int) (string, any, bool) {
	var key, value []byte
	var haveKey, haveValue bool
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != entryKey && num != entryValue) {
			return "", nil, false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return "", nil, false
		}
		b = b[n+m:]
		if num == entryKey {
			if haveKey {
				return "", nil, false
			}
			key, haveKey = v, true
		} else {
			if haveValue {
				return "", nil, false
			}
			value, haveValue = v, true
		}
	}
	if !utf8.Valid(key) {
		return "", nil, false
	}
	v, ok := decodeValue(value, level+1)
	return string(key), v, ok
}

// decodeValue reads a Value (one field, its kind) at nesting level.
func decodeValue(b []byte, level int) (any, bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return nil, false
	}
	b = b[n:]
	var v any
	var m int
	switch {
	case num == valueNull && typ == protowire.VarintType:
		_, m = protowire.ConsumeVarint(b)
	case num == valueNumber && typ == protowire.Fixed64Type:
		var x uint64
		x, m = protowire.ConsumeFixed64(b)
		f := math.Float64frombits(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, false
		}
		v = f
	case num == valueBool && typ == protowire.VarintType:
		var x uint64
		x, m = protowire.ConsumeVarint(b)
		v = protowire.DecodeBool(x)
	case typ == protowire.BytesType && (num == valueString || num == valueStruct || num == valueList):
		var s []byte
		s, m = protowire.ConsumeBytes(b)
		if m < 0 {
			return nil, false
		}
		var ok bool
		if v, ok = decodeBytesValue(num, s, level); !ok {
			return nil, false
		}
	default:
		return nil, false
	}
	if m < 0 || m != len(b) {
		return nil, false // malformed, or more fields than the kind
	}
	return v, true
}

// decodeBytesValue reads a Value's string, Struct or ListValue.
func decodeBytesValue(num protowire.Number, b []byte, level int) (any, bool) {
	switch num {
	case valueString:
		if !utf8.Valid(b) {
			return nil, false
		}
		return string(b), true
	case valueStruct:
		if level > paramsDepth {
			return nil, false
		}
		return decodeStruct(b, level)
	}
	if level > paramsDepth {
		return nil, false
	}
	var l []any
	for len(b) > 0 {
		e, rest, ok := nextBytes(b, listValues)
		if !ok {
			return nil, false
		}
		b = rest
		v, ok := decodeValue(e, level+1)
		if !ok {
			return nil, false
		}
		l = append(l, v)
	}
	if l == nil {
		l = []any{}
	}
	return l, true
}

// nextBytes reads the first field of b, which must be the length-delimited
// field num, and returns its bytes and what follows it.
func nextBytes(b []byte, num protowire.Number) (v, rest []byte, ok bool) {
	got, typ, n := protowire.ConsumeTag(b)
	if n < 0 || got != num || typ != protowire.BytesType {
		return nil, nil, false
	}
	v, m := protowire.ConsumeBytes(b[n:])
	if m < 0 {
		return nil, nil, false
	}
	return v, b[n+m:], true
}

// countEntries returns how many fields b, a Struct's bytes, has.
func countEntries(b []byte) int {
	n := 0
	for len(b) > 0 {
		_, _, m := protowire.ConsumeField(b)
		if m < 0 {
			break
		}
		b = b[m:]
		n++
	}
	return n
}
