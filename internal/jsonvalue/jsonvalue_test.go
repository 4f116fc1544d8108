package jsonvalue

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/opledger/ledger/fingerprint"
)

// Bytes that are not valid UTF-8 are refused wherever they are, but the
// text \ufffd and a valid U+FFFD are strings like any other.
func TestParamsRefusesOnlyInvalidUTF8(t *testing.T) {
	for _, tc := range []struct {
		params map[string]any
		ok     bool
	}{
		{map[string]any{"s": []string{"caf\xe9"}}, false},
		{map[string]any{"s": []string{`\` + "\xff"}}, false},
		{map[string]any{"s": map[string]string{"\xff": "x"}}, false},
		{map[string]any{"s": "\xff", "n": int32(1)}, false},
		{map[string]any{"s": []string{`\ufffd`}}, true},
		{map[string]any{"s": []string{`\\` + "\ufffd"}}, true},
		{map[string]any{"s": []string{"\ufffd", `\ufffd`}}, true},
	} {
		out, err := Params(tc.params)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, fingerprint.ErrNotCanonical) {
			t.Errorf("Params(%q) = %v, %v; want ok=%v", tc.params, out, err, tc.ok)
			continue
		}
		if tc.ok {
			if _, err := fingerprint.Canonical(out); err != nil || out["s"].([]any)[0] != tc.params["s"].([]string)[0] {
				t.Errorf("Params(%q) = %q, %v; want the same strings", tc.params, out, err)
			}
		}
	}
}

// hidden is an unexported integer type, which json.Marshal skips when it is
// embedded.
type hidden int64

// A Go integer beyond 2^53 is refused wherever it is, as it is at the top
// of a map[string]any, even when its JSON digits are those of the double
// nearest to it (1152921504606847000 is written so, and 2^60 is that
// double): taken as the double, it would be sent as another integer.
func TestParamsRefusesIntegersTheWireWouldRound(t *testing.T) {
	const n = 1152921504606847000 // 2^60 + 24
	type ids struct{ ID int64 }
	for _, params := range []map[string]any{
		{"id": int64(n)},
		{"id": uint64(n)},
		{"ids": []int64{n}},
		{"ids": map[string]int64{"a": -n}},
		{"ids": ids{ID: n}},
		{"ids": []any{&ids{ID: n}}},
	} {
		if out, err := Params(params); !errors.Is(err, fingerprint.ErrNotCanonical) {
			t.Errorf("Params(%v) = %v, %v; want it refused", params, out, err)
		}
	}
	// A double is the double it is, and integers that fit are kept.
	for _, params := range []map[string]any{
		{"x": []float64{n}},
		{"x": []int64{1 << 53, -(1 << 53)}},
		{"x": ids{ID: 1 << 53}},
		{"x": struct {
			ID int64 `json:",string"`
		}{ID: n}},
		{"x": struct {
			hidden // not encoded: an embedded field of an unexported type that is no struct
			ID     int64
		}{hidden: n, ID: 1}},
	} {
		if _, err := Params(params); err != nil {
			t.Errorf("Params(%v) = %v; want it taken", params, err)
		}
	}
}

// A json.Number (JSON decoded with UseNumber) holding an integer that no
// double carries is refused, at the top of the params or deeper, rather
// than sent as the double nearest to it: 9007199254740993 would be sent as
// 9007199254740992, another request's value. An integer written as its
// double's digits, and any other number, is taken.
func TestParamsRefusesJSONNumbersTheWireWouldRound(t *testing.T) {
	for _, params := range []map[string]any{
		{"n": json.Number("9007199254740993")},
		{"n": []any{json.Number("-9007199254740993")}},
		{"n": []json.Number{"18446744073709551615"}},
		{"n": map[string]any{"m": json.Number("1152921504606846976")}}, // 2^60, whose double is written 1152921504606847000
	} {
		if out, err := Params(params); !errors.Is(err, fingerprint.ErrNotCanonical) {
			t.Errorf("Params(%v) = %v, %v; want it refused", params, out, err)
		}
	}
	for _, params := range []map[string]any{
		{"n": json.Number("9007199254740992")},
		{"n": json.Number("100000000000000000000")},
		{"n": []any{json.Number("0.1"), json.Number("1e300")}},
	} {
		if _, err := Params(params); err != nil {
			t.Errorf("Params(%v) = %v; want it taken", params, err)
		}
	}
}

// ExactIntegers: what a double carries as written, and what it would change.
func TestExactIntegers(t *testing.T) {
	for n, want := range map[json.Number]bool{
		"0": true, "-0": true, "42": true, "0.1": true, "1.5e300": true, "-2.5E-7": true,
		"9007199254740992":      true, // 2^53
		"-9007199254740992":     true,
		"100000000000000000000": true,  // 1e20's digits
		"1152921504606847000":   true,  // 2^60's digits as a double writes them
		"1152921504606846976":   false, // 2^60's own digits: not the double's, so refused as the fingerprint's
		"9007199254740993":      false,
		"-9007199254740993":     false,
		"123456789012345678901": false,
		"1e400":                 false,
		"-1e400":                false,
	} {
		if got := ExactIntegers([]any{n}) == nil; got != want {
			t.Errorf("ExactIntegers([%s]) = %v, want %v", n, got, want)
		}
	}
}
