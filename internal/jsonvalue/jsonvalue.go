// Package jsonvalue converts Go values to the JSON values the ledger
// fingerprints and carries (map[string]any, []any, string, float64, bool,
// nil), through their JSON encoding. The client SDK (Op.Params) and the
// agent runner (tool call arguments, result data) share it, so the same
// parameters built in Go or decoded from JSON are one request.
package jsonvalue

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/opledger/ledger/fingerprint"
)

// Params returns params as the ledger fingerprints them: as they are when
// they have a canonical form (fingerprint.Canonical), otherwise as the
// JSON values they encode to ([]string, map[string]string, []int, int32,
// time.Time, structs...). Numbers keep their value in the conversion: a Go
// integer beyond 2^53, which the wire's doubles would round (2^53+1), is
// refused wherever it is, as it is unconverted, even when its JSON digits
// are those of the nearest double (1152921504606847000, 2^60's), and so is
// a json.Number holding an integer no double carries (9007199254740993),
// while a large float64 ([]float64{1e20}) is the double it is. Params with no JSON form, among them strings that
// are not valid UTF-8 (JSON encoding would replace their bytes, making
// different strings one), are refused with the fingerprint's error, which
// names the field, never a value. Every error wraps
// fingerprint.ErrNotCanonical.
func Params(params map[string]any) (map[string]any, error) {
	if roundedInteger(reflect.ValueOf(params), 0) {
		// The fingerprint takes a json.Number as its double; and a Go
		// integer's JSON digits may be those of the double nearest to it
		// (1152921504606847000, 2^60's), which exactDouble would take:
		// either way, another integer.
		return nil, errNotADouble
	}
	_, cerr := fingerprint.Canonical(params)
	if cerr == nil {
		return params, nil
	}
	b, err := json.Marshal(params)
	if err != nil || replacedBytes(b) {
		return nil, cerr
	}
	out, err := decode(b, true)
	if err != nil {
		return nil, cerr
	}
	if err := ExactIntegers(out); err != nil {
		return nil, err
	}
	if _, err := fingerprint.Canonical(out); err != nil {
		return nil, err
	}
	return out, nil
}

// Decode returns m's JSON encoding decoded again: map[string]any, []any,
// string, bool, nil, and float64 or, with numbers, json.Number.
func Decode(m map[string]any, numbers bool) (map[string]any, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return decode(b, numbers)
}

// decode decodes the JSON object b, as Decode does.
func decode(b []byte, numbers bool) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if numbers {
		dec.UseNumber()
	}
	var out map[string]any
	if err := dec.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}

// replacedBytes reports whether the JSON text b, from json.Marshal, holds
// the escape \ufffd, which json.Marshal writes in place of bytes that are
// not valid UTF-8 (a valid U+FFFD is written as it is): such a string has
// no JSON form, and its replacement would make different strings one.
func replacedBytes(b []byte) bool {
	for i := bytes.Index(b, []byte(`\ufffd`)); i >= 0; {
		n := 0 // backslashes before the escape's own
		for j := i - 1; j >= 0 && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return true
		}
		next := bytes.Index(b[i+1:], []byte(`\ufffd`))
		if next < 0 {
			break
		}
		i += 1 + next
	}
	return false
}

// roundedInteger reports whether v holds, where its JSON encoding takes
// values from, a Go integer beyond ±2^53, which the wire's doubles would
// round: it looks through interfaces, pointers, map values, slice and
// array elements, and the exported fields of structs that json.Marshal
// encodes (not those tagged "-" or ",string"), but not into values that
// encode themselves (json.Marshaler, encoding.TextMarshaler).
func roundedInteger(v reflect.Value, depth int) bool {
	if !v.IsValid() || depth > fingerprint.MaxDepth+1 {
		return false // nothing, or too deep: refused anyway
	}
	if v.Type() == numberType {
		_, err := number(json.Number(v.String()))
		return err != nil
	}
	if encodesItself(v.Type()) || v.CanAddr() && encodesItself(v.Addr().Type()) {
		return false
	}
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() > maxExact || v.Int() < -maxExact
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Uint() > maxExact
	case reflect.Interface, reflect.Pointer:
		return !v.IsNil() && roundedInteger(v.Elem(), depth)
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if roundedInteger(it.Value(), depth+1) {
				return true
			}
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return false // bytes: base64, or small numbers
		}
		for i := range v.Len() {
			if roundedInteger(v.Index(i), depth+1) {
				return true
			}
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() && !embeddedStruct(f) {
				continue // json.Marshal skips it
			}
			tag := f.Tag.Get("json")
			if tag == "-" || slices.Contains(strings.Split(tag, ",")[1:], "string") {
				continue
			}
			if roundedInteger(v.Field(i), depth+1) {
				return true
			}
		}
	}
	return false
}

// embeddedStruct says whether f is an embedded struct (or pointer to one),
// whose exported fields json.Marshal encodes even when its type is not.
func embeddedStruct(f reflect.StructField) bool {
	t := f.Type
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return f.Anonymous && t.Kind() == reflect.Struct
}

// encodesItself says whether values of t write their own JSON
// (json.Marshaler, encoding.TextMarshaler): what they hold is theirs.
func encodesItself(t reflect.Type) bool {
	return t.Kind() != reflect.Interface && (t.Implements(jsonMarshaler) || t.Implements(textMarshaler))
}

var (
	numberType    = reflect.TypeFor[json.Number]()
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// errNotADouble refuses a number that no IEEE 754 double carries exactly
// (an integer beyond the int64 range, or beyond the double range).
var errNotADouble = fmt.Errorf("%w: a number is not exactly representable as an IEEE 754 double", fingerprint.ErrNotCanonical)

// maxExact is the largest magnitude up to which every integer is a double.
const maxExact = 1 << 53

// exactDouble returns the integer n, beyond ±2^53, as a double when the
// double's canonical form is n as written, as it is for a large float64
// (json.Marshal writes float64(1e20) as 100000000000000000000, and 2^60
// as 1152921504606847000, the digits the fingerprint writes too). Any
// other integer is refused: the wire would round it (2^53+1), and two
// integers would be one request.
func exactDouble(n json.Number) (any, error) {
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil {
		return nil, errNotADouble
	}
	if b, err := fingerprint.Canonical(f); err != nil || string(b) != string(n) {
		return nil, errNotADouble
	}
	return f, nil
}

// number returns n as ExactIntegers takes it: an int64 for an integer up
// to ±2^53, a float64 for an integer beyond it written as its double's
// canonical form (see exactDouble) and for any other number; other
// integers, and numbers beyond the double range, are refused.
func number(n json.Number) (any, error) {
	if !strings.ContainsAny(string(n), ".eE") {
		if i, err := n.Int64(); err == nil && -maxExact <= i && i <= maxExact {
			return i, nil
		}
		return exactDouble(n)
	}
	f, err := n.Float64()
	if err != nil {
		return nil, errNotADouble // its message would quote the value
	}
	return f, nil
}

// ExactIntegers replaces, in place, the json.Number values of the objects
// and lists of v (decoded with Decode's numbers, or UseNumber) by int64
// for integers up to ±2^53, float64 for integers beyond it written as
// their double's canonical form (see exactDouble: 100000000000000000000),
// and float64 for other numbers. It refuses the numbers a double would
// carry changed: other integers (9007199254740993) and numbers beyond the
// double range (1e400).
func ExactIntegers(v any) error {
	convert := func(x any) (any, error) {
		n, ok := x.(json.Number)
		if !ok {
			return x, ExactIntegers(x)
		}
		return number(n)
	}
	var err error
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if x[k], err = convert(e); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range x {
			if x[i], err = convert(e); err != nil {
				return err
			}
		}
	}
	return nil
}
