package main

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseData: --data is accepted only as one JSON object in valid UTF-8
// with each key once per object and every number exactly a 64-bit float;
// what it yields is what encoding/json decodes, holds no U+FFFD the text
// did not write, and written back as JSON it parses to the same data (so
// "a" and "\u0061" are one key, and one spelling of it is as good as the
// other). A refused --data is refused with a message.
func FuzzParseData(f *testing.F) {
	for _, s := range []string{
		`{"json":"object"}`,
		`{"status":"succeeded","amount":1250}`,
		`{"charge_id": "9007199254740993"}`,
		`{"charge_id": 9007199254740993}`,
		`{"a":1,"a":2}`,
		`{"a":1,"\u0061":2}`,
		`{"x":{"a":[{"b":1,"b":2}]}}`,
		`{"a":"caf\u00e9","b":[1.5,-0,1e21,5e-324,0.1]}`,
		`{"a":1e400}`,
		`{"a":1e-400}`,
		`{"a":"\ufffd"}`,
		`{} {}`,
		`[1,2]`,
		`null`,
		"{\"a\":\"\xff\"}",
		``,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseData(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("%q refused with an empty message", s)
			}
			return
		}
		if !utf8.ValidString(s) {
			t.Fatalf("accepted %q, not valid UTF-8", s)
		}
		var want map[string]any
		if err := json.Unmarshal([]byte(s), &want); err != nil || !reflect.DeepEqual(m, want) {
			t.Fatalf("%q: parsed %#v, encoding/json decodes %#v (%v)", s, m, want, err)
		}
		if got, written := members(m), colonsOutsideStrings(s); got != written {
			t.Fatalf("%q: accepted with %d members written and %d kept (a duplicate key?)", s, written, got)
		}
		if strings.Contains(stringsIn(m), "\ufffd") && !strings.Contains(strings.ToLower(s), `\ufffd`) && !strings.Contains(s, "\ufffd") {
			t.Fatalf("%q: parsed with U+FFFD the text does not hold: %#v", s, m)
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		again, err := parseData(string(b))
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("%q written back as %s: %#v, %v", s, b, again, err)
		}
	})
}

// members counts the object members in v, at any depth.
func members(v any) int {
	n := 0
	switch v := v.(type) {
	case map[string]any:
		n += len(v)
		for _, e := range v {
			n += members(e)
		}
	case []any:
		for _, e := range v {
			n += members(e)
		}
	}
	return n
}

// colonsOutsideStrings counts the ':' of the JSON text s that are not in a
// string: one per object member written.
func colonsOutsideStrings(s string) int {
	n, in, esc := 0, false, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case esc:
			esc = false
		case in && c == '\\':
			esc = true
		case c == '"':
			in = !in
		case !in && c == ':':
			n++
		}
	}
	return n
}

// stringsIn joins the keys and strings of v.
func stringsIn(v any) string {
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			b.WriteString(v)
		case map[string]any:
			for k, e := range v {
				b.WriteString(k)
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return b.String()
}

// FuzzFencingToken: --fencing-token takes exactly the decimal numbers
// lookup prints (no sign, no leading zero, no base prefix, not 0, within
// 64 bits), each as itself; anything else is refused with a message and
// sets nothing.
func FuzzFencingToken(f *testing.F) {
	for _, s := range []string{"1", "42", "18446744073709551615", "18446744073709551616", "0", "00", "007", "+1", "-1", "0x10", "1_000", " 1", "1 ", "", "１"} {
		f.Add(s)
	}
	decimal := regexp.MustCompile(`^[1-9][0-9]*$`)
	f.Fuzz(func(t *testing.T, v string) {
		var n uint64
		err := fencingToken{&n}.Set(v)
		_, rangeErr := strconv.ParseUint(v, 10, 64)
		if want := decimal.MatchString(v) && rangeErr == nil; (err == nil) != want {
			t.Fatalf("%q: %v", v, err)
		}
		if err != nil {
			if n != 0 || err.Error() == "" {
				t.Fatalf("%q refused with %q, set to %d", v, err, n)
			}
			return
		}
		if strconv.FormatUint(n, 10) != v {
			t.Fatalf("%q read as %d", v, n)
		}
	})
}
