package server

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/opledger/ledger/fingerprint"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// resultDataField is the field number of ledger.v1.Result.data.
const resultDataField protowire.Number = 1

// appendResultData appends a recorded result's data (the canonical JSON the
// ledger stored, fingerprint.Canonical's form) to b as the wire bytes of
// ledger.v1.Result's data field, a google.protobuf.Struct. Replays, Lookups
// and Completes do this on every call, so it writes the wire bytes
// straight from the JSON (docs/benchmarks.md, section 6.13); whatever that
// writer does not take (a surrogate escape, members out of canonical order,
// nesting deeper than it goes) is left to protojson and proto.Marshal, with
// the same Struct. On an error it returns b as it was.
func appendResultData(b, data []byte) ([]byte, error) {
	if out, err := writeJSONStruct(b, data); err == nil {
		return out, nil
	}
	s := &structpb.Struct{}
	if err := protojson.Unmarshal(data, s); err != nil {
		return b, err
	}
	w, err := proto.Marshal(s)
	if err != nil {
		return b, err
	}
	return protowire.AppendBytes(protowire.AppendTag(b, resultDataField, protowire.BytesType), w), nil
}

// jsonMaxDepth bounds the nesting writeJSONStruct follows; deeper documents
// go to protojson (fingerprint.Canonical itself stops at 64 levels).
const jsonMaxDepth = 100

var errJSON = errors.New("not JSON this writer takes")

// writeJSONStruct appends one JSON object (RFC 8259, strict: no trailing
// content, valid UTF-8, numbers that fit a float64, members in the order of
// RFC 8785, each name once) to b as the data field of a ledger.v1.Result.
// It never takes a document protojson would refuse or read differently
// (FuzzWriteJSONStruct).
func writeJSONStruct(b, data []byte) ([]byte, error) {
	w := jsonWriter{b: data, out: b}
	w.space()
	if w.i >= len(w.b) || w.b[w.i] != '{' {
		return nil, errJSON
	}
	at := w.open(resultDataField)
	if err := w.object(1); err != nil {
		return nil, err
	}
	w.close(at)
	w.space()
	if w.i != len(w.b) {
		return nil, errJSON
	}
	return w.out, nil
}

// jsonWriter reads JSON from b at i and appends protobuf wire bytes to out.
type jsonWriter struct {
	b   []byte
	i   int
	out []byte
}

// open appends the tag of the length-delimited field num and returns where
// its contents start; close puts their length there once they are written.
func (w *jsonWriter) open(num protowire.Number) int {
	w.out = protowire.AppendTag(w.out, num, protowire.BytesType)
	return len(w.out)
}

func (w *jsonWriter) close(at int) {
	n := len(w.out) - at
	size := protowire.SizeVarint(uint64(n))
	w.out = append(w.out, make([]byte, size)...)
	copy(w.out[at+size:], w.out[at:at+n])
	protowire.AppendVarint(w.out[:at], uint64(n))
}

func (w *jsonWriter) space() {
	for w.i < len(w.b) {
		switch w.b[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

// object writes the members of the object at b[i] == '{' as a Struct's
// fields.
func (w *jsonWriter) object(depth int) error {
	if depth > jsonMaxDepth {
		return errJSON
	}
	w.i++
	w.space()
	if w.i < len(w.b) && w.b[w.i] == '}' {
		w.i++
		return nil
	}
	var last []byte
	for n := 0; ; n++ {
		if w.i >= len(w.b) || w.b[w.i] != '"' {
			return errJSON
		}
		k, err := w.string()
		if err != nil {
			return err
		}
		// Canonical order makes a repeated name visible as a name not
		// after the one before it.
		if n > 0 && fingerprint.CompareUTF16(string(last), string(k)) >= 0 {
			return errJSON
		}
		last = k
		w.space()
		if w.i >= len(w.b) || w.b[w.i] != ':' {
			return errJSON
		}
		w.i++
		w.space()
		entry := w.open(structFields)
		w.out = protowire.AppendBytes(protowire.AppendTag(w.out, entryKey, protowire.BytesType), k)
		value := w.open(entryValue)
		if err := w.value(depth); err != nil {
			return err
		}
		w.close(value)
		w.close(entry)
		if done, err := w.after('}'); err != nil || done {
			return err
		}
	}
}

// after reads what follows a member or an element: a comma (more to come)
// or the container's closing byte (done).
func (w *jsonWriter) after(closing byte) (done bool, err error) {
	w.space()
	if w.i >= len(w.b) {
		return false, errJSON
	}
	switch w.b[w.i] {
	case ',':
		w.i++
		w.space()
		return false, nil
	case closing:
		w.i++
		return true, nil
	}
	return false, errJSON
}

// value writes the value at i, inside a container at depth, as the fields
// of a Value.
func (w *jsonWriter) value(depth int) error {
	if w.i >= len(w.b) {
		return errJSON
	}
	switch c := w.b[w.i]; {
	case c == '{':
		at := w.open(valueStruct)
		if err := w.object(depth + 1); err != nil {
			return err
		}
		w.close(at)
	case c == '[':
		at := w.open(valueList)
		if err := w.array(depth + 1); err != nil {
			return err
		}
		w.close(at)
	case c == '"':
		s, err := w.string()
		if err != nil {
			return err
		}
		w.out = protowire.AppendBytes(protowire.AppendTag(w.out, valueString, protowire.BytesType), s)
	case c == '-' || c >= '0' && c <= '9':
		f, err := w.number()
		if err != nil {
			return err
		}
		w.out = protowire.AppendFixed64(protowire.AppendTag(w.out, valueNumber, protowire.Fixed64Type), math.Float64bits(f))
	case w.literal("true"):
		w.out = protowire.AppendVarint(protowire.AppendTag(w.out, valueBool, protowire.VarintType), 1)
	case w.literal("false"):
		w.out = protowire.AppendVarint(protowire.AppendTag(w.out, valueBool, protowire.VarintType), 0)
	case w.literal("null"):
		w.out = protowire.AppendVarint(protowire.AppendTag(w.out, valueNull, protowire.VarintType), 0)
	default:
		return errJSON
	}
	return nil
}

func (w *jsonWriter) literal(word string) bool {
	if len(w.b)-w.i < len(word) || string(w.b[w.i:w.i+len(word)]) != word {
		return false
	}
	w.i += len(word)
	return true
}

// array writes the elements of the array at b[i] == '[' as a ListValue's
// values.
func (w *jsonWriter) array(depth int) error {
	if depth > jsonMaxDepth {
		return errJSON
	}
	w.i++
	w.space()
	if w.i < len(w.b) && w.b[w.i] == ']' {
		w.i++
		return nil
	}
	for {
		at := w.open(listValues)
		if err := w.value(depth); err != nil {
			return err
		}
		w.close(at)
		if done, err := w.after(']'); err != nil || done {
			return err
		}
	}
}

// number reads a number, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?,
// that a float64 holds.
func (w *jsonWriter) number() (float64, error) {
	start := w.i
	if w.b[w.i] == '-' {
		w.i++
	}
	switch {
	case w.i < len(w.b) && w.b[w.i] == '0':
		w.i++
	case w.digits() == 0:
		return 0, errJSON
	}
	integer := w.i
	if w.i < len(w.b) && w.b[w.i] == '.' {
		w.i++
		if w.digits() == 0 {
			return 0, errJSON
		}
	}
	if w.i < len(w.b) && (w.b[w.i] == 'e' || w.b[w.i] == 'E') {
		w.i++
		if w.i < len(w.b) && (w.b[w.i] == '+' || w.b[w.i] == '-') {
			w.i++
		}
		if w.digits() == 0 {
			return 0, errJSON
		}
	}
	if f, ok := smallInteger(w.b[start:w.i], w.i == integer); ok {
		return f, nil
	}
	f, err := strconv.ParseFloat(string(w.b[start:w.i]), 64)
	if err != nil {
		return 0, errJSON
	}
	return f, nil
}

// smallInteger reads an integer of at most 15 digits (whole is false for
// a number with a fraction or an exponent), which a float64 holds
// exactly, without strconv.
func smallInteger(b []byte, whole bool) (float64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if !whole || len(b) > 15 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		n = n*10 + int64(c-'0')
	}
	f := float64(n)
	if neg {
		f = -f
	}
	return f, true
}

func (w *jsonWriter) digits() int {
	n := 0
	for w.i < len(w.b) && w.b[w.i] >= '0' && w.b[w.i] <= '9' {
		w.i++
		n++
	}
	return n
}

// string reads a string at b[i] == '"' and returns its contents: a part of
// b when it has no escape. Escapes of UTF-16 surrogates are left to
// protojson.
func (w *jsonWriter) string() ([]byte, error) {
	w.i++
	start := w.i
	for w.i < len(w.b) {
		c := w.b[w.i]
		switch {
		case c == '"':
			raw := w.b[start:w.i]
			w.i++
			if !utf8.Valid(raw) {
				return nil, errJSON
			}
			return raw, nil
		case c == '\\':
			return w.escaped(start)
		case c < 0x20:
			return nil, errJSON
		}
		w.i++
	}
	return nil, errJSON
}

// escaped continues a string from its first escape, at i.
func (w *jsonWriter) escaped(start int) ([]byte, error) {
	buf := bytes.Clone(w.b[start:w.i])
	for w.i < len(w.b) {
		c := w.b[w.i]
		switch {
		case c == '"':
			w.i++
			if !utf8.Valid(buf) {
				return nil, errJSON
			}
			return buf, nil
		case c < 0x20:
			return nil, errJSON
		case c != '\\':
			buf = append(buf, c)
			w.i++
			continue
		}
		if w.i+1 >= len(w.b) {
			return nil, errJSON
		}
		switch e := w.b[w.i+1]; e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			if w.i+6 > len(w.b) {
				return nil, errJSON
			}
			r, err := strconv.ParseUint(string(w.b[w.i+2:w.i+6]), 16, 32)
			if err != nil || r >= 0xD800 && r <= 0xDFFF {
				return nil, errJSON
			}
			buf = utf8.AppendRune(buf, rune(r))
			w.i += 4
		default:
			return nil, errJSON
		}
		w.i += 2
	}
	return nil, errJSON
}
