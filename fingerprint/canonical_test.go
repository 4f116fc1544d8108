package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// rfc8785Input is the example of RFC 8785 section 3.2.2.
const rfc8785Input = `{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`

// rfc8785Output is its canonical form (RFC 8785 section 3.2.4). The string
// member decodes to the characters U+20AC, $, U+000F, U+000A, A, apostrophe,
// B, quotation mark, backslash, backslash, quotation mark, solidus; which
// JSON.stringify writes as €$\u000f\nA'B\"\\\\\"/ (control characters
// other than \n as lowercase \u00xx, solidus and U+20AC literally).
const rfc8785Output = `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`

// rfc8785SortInput is the sorting example of RFC 8785 section 3.2.3.
const rfc8785SortInput = `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`

const rfc8785SortOutput = "{" +
	`"\r":"Carriage Return",` +
	`"1":"One",` +
	"\"\u0080\":\"Control\"," +
	"\"\u00f6\":\"Latin Small Letter O With Diaeresis\"," +
	"\"\u20ac\":\"Euro Sign\"," +
	"\"\U0001F600\":\"Emoji: Grinning Face\"," +
	"\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"" +
	"}"

func decodeJSON(t testing.TB, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("json.Unmarshal(%q): %v", s, err)
	}
	return v
}

func mustCanonical(t testing.TB, v any) string {
	t.Helper()
	b, err := Canonical(v)
	if err != nil {
		t.Fatalf("Canonical: %v", err)
	}
	return string(b)
}

func TestCanonicalJSONRFC8785Examples(t *testing.T) {
	// The escaped form of the expected output must be what the RFC prints:
	// €$\u000f\nA'B\"\\\\\"/ (with the literal backslashes shown).
	if !strings.Contains(rfc8785Output, `"string":"€$\u000f\nA'B\"\\\\\"/"`) {
		t.Fatal("test constant mangled")
	}
	for _, tc := range []struct{ name, in, want string }{
		{"3.2.2", rfc8785Input, rfc8785Output},
		{"3.2.3 sorting", rfc8785SortInput, rfc8785SortOutput},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mustCanonical(t, decodeJSON(t, tc.in))
			if got != tc.want {
				t.Errorf("Canonical =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestCanonicalJSONNumbers(t *testing.T) {
	// RFC 8785 Appendix B (also checked against V8's JSON.stringify).
	appendixB := []struct {
		bits uint64
		want string
	}{
		{0x0000000000000000, "0"},
		{0x8000000000000000, "0"}, // -0
		{0x0000000000000001, "5e-324"},
		{0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e+308"},
		{0xffefffffffffffff, "-1.7976931348623157e+308"},
		{0x4340000000000000, "9007199254740992"},
		{0xc340000000000000, "-9007199254740992"},
		{0x4430000000000000, "295147905179352830000"},
		{0x44b52d02c7e14af5, "9.999999999999997e+22"},
		{0x44b52d02c7e14af6, "1e+23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
		{0x444b1ae4d6e2ef4e, "999999999999999700000"},
		{0x444b1ae4d6e2ef4f, "999999999999999900000"},
		{0x444b1ae4d6e2ef50, "1e+21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
		{0x3eb0c6f7a0b5ed8d, "0.000001"},
		{0x41b3de4355555553, "333333333.3333332"},
		{0x41b3de4355555554, "333333333.33333325"},
		{0x41b3de4355555555, "333333333.3333333"},
		{0x41b3de4355555556, "333333333.3333334"},
		{0x41b3de4355555557, "333333333.33333343"},
		{0xbecbf647612f3696, "-0.0000033333333333333333"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	}
	for _, tc := range appendixB {
		f := math.Float64frombits(tc.bits)
		if got := mustCanonical(t, f); got != tc.want {
			t.Errorf("%016x (%v): got %s, want %s", tc.bits, f, got, tc.want)
		}
	}

	others := []struct {
		f    float64
		want string
	}{
		{1, "1"},
		{-1, "-1"},
		{0.1, "0.1"},
		{-1.5, "-1.5"},
		{100, "100"},
		{1e20, "100000000000000000000"},
		{1e21, "1e+21"},
		{-1e21, "-1e+21"},
		{1.5e21, "1.5e+21"},
		{1e22, "1e+22"},
		{1e30, "1e+30"},
		{1e100, "1e+100"},
		{1e-6, "0.000001"},
		{1.5e-6, "0.0000015"},
		{1e-7, "1e-7"},
		{-1e-7, "-1e-7"},
		{1.25e-7, "1.25e-7"},
		{1e-9, "1e-9"},
		{1e-10, "1e-10"},
		{1e-100, "1e-100"},
		{123456789012, "123456789012"},
		{0.000123, "0.000123"},
		{2.2250738585072014e-308, "2.2250738585072014e-308"},
	}
	for _, tc := range others {
		if got := mustCanonical(t, tc.f); got != tc.want {
			t.Errorf("%v: got %s, want %s", tc.f, got, tc.want)
		}
	}
}

// TestCanonicalJSONNumberProperties checks structural properties of the
// number format over many bit patterns: the output parses back to the same
// double, uses fixed notation exactly for 1e-6 <= |x| < 1e21, has no leading
// zero in the exponent, and uses the shortest round-trip digits.
func TestCanonicalJSONNumberProperties(t *testing.T) {
	n := 200000
	if testing.Short() {
		n = 20000
	}
	state := uint64(0x9e3779b97f4a7c15)
	for i := range n {
		// splitmix64
		state += 0x9e3779b97f4a7c15
		z := state
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		if i%4 == 0 {
			z = math.Float64bits(float64(int64(z)>>uint(i%60)) / 1000)
		}
		f := math.Float64frombits(z)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		s := string(appendNumber(nil, f))
		back, err := strconv.ParseFloat(s, 64)
		if err != nil || back != f {
			t.Fatalf("%016x: %q does not round-trip (%v, %v)", z, s, back, err)
		}
		abs := math.Abs(f)
		e := strings.IndexByte(s, 'e')
		if abs != 0 && (abs >= 1e21 || abs < 1e-6) {
			if e < 0 || (s[e+1] != '+' && s[e+1] != '-') || s[e+2] == '0' {
				t.Fatalf("%016x: bad exponent form %q", z, s)
			}
		} else if e >= 0 {
			t.Fatalf("%016x: want fixed notation, got %q", z, s)
		}
		// Shortest digits: same significant digits as Go's shortest 'e' form.
		g := strconv.FormatFloat(abs, 'e', -1, 64)
		wantDigits := strings.Replace(g[:strings.IndexByte(g, 'e')], ".", "", 1)
		mant := strings.TrimPrefix(s, "-")
		if e >= 0 {
			mant = mant[:strings.IndexByte(mant, 'e')]
		}
		gotDigits := strings.Trim(strings.Replace(mant, ".", "", 1), "0")
		if abs != 0 && gotDigits != strings.Trim(wantDigits, "0") {
			t.Fatalf("%016x: %q digits %q, want %q", z, s, gotDigits, wantDigits)
		}
	}
}

func TestCanonicalJSONStrings(t *testing.T) {
	ctl := []string{
		`\u0000`, `\u0001`, `\u0002`, `\u0003`, `\u0004`, `\u0005`, `\u0006`, `\u0007`,
		`\b`, `\t`, `\n`, `\u000b`, `\f`, `\r`, `\u000e`, `\u000f`,
		`\u0010`, `\u0011`, `\u0012`, `\u0013`, `\u0014`, `\u0015`, `\u0016`, `\u0017`,
		`\u0018`, `\u0019`, `\u001a`, `\u001b`, `\u001c`, `\u001d`, `\u001e`, `\u001f`,
	}
	for c, want := range ctl {
		if got := mustCanonical(t, string(rune(c))); got != `"`+want+`"` {
			t.Errorf("U+%04X: got %s, want %q", c, got, want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"plain", `"plain"`},
		{`"`, `"\""`},
		{`\`, `"\\"`},
		{"/", `"/"`},
		{"<>&", `"<>&"`},
		{"\u007f", "\"\u007f\""},
		{"\u0080", "\"\u0080\""},
		{"\u2028\u2029", "\"\u2028\u2029\""},
		{"\ufeff", "\"\ufeff\""},
		{"\uffff", "\"\uffff\""},
		{"\ufffd", "\"\ufffd\""},
		{"\U0001F600", "\"\U0001F600\""},
		{"\U0010FFFF", "\"\U0010FFFF\""},
		{"a\"b\\c\nd\u001fe€", `"a\"b\\c\nd\u001fe€"`},
	} {
		if got := mustCanonical(t, tc.in); got != tc.want {
			t.Errorf("%q: got %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestCanonicalJSONKeyOrderUTF16(t *testing.T) {
	// U+E000 is EE 80 80 in UTF-8 and 0xE000 in UTF-16; U+1F600 is
	// F0 9F 98 80 in UTF-8 and 0xD83D 0xDE00 in UTF-16. Byte order puts
	// U+E000 first, UTF-16 order puts U+1F600 first.
	v := map[string]any{"\ue000": 1.0, "\U0001F600": 2.0, "\uffff": 3.0, "\ud7ff": 4.0, "a": 5.0}
	want := "{\"a\":5,\"\ud7ff\":4,\"\U0001F600\":2,\"\ue000\":1,\"\uffff\":3}"
	if got := mustCanonical(t, v); got != want {
		t.Errorf("got %s, want %s", got, want)
	}

	// Prefixes, and supplementary characters among themselves.
	v = map[string]any{
		"ab": nil, "a": nil, "": nil, "b": nil, "a\U0001F600": nil,
		"\U0001F601": nil, "\U0001F600": nil, "\U00010000": nil, "\U0010FFFF": nil, "\U0001F600x": nil,
	}
	want = `{"":null,"a":null,"ab":null,"a` + "\U0001F600" + `":null,"b":null,"` +
		"\U00010000" + `":null,"` + "\U0001F600" + `":null,"` + "\U0001F600" + `x":null,"` +
		"\U0001F601" + `":null,"` + "\U0010FFFF" + `":null}`
	if got := mustCanonical(t, v); got != want {
		t.Errorf("got %s,\nwant %s", got, want)
	}
}

func TestCanonicalCompareUTF16(t *testing.T) {
	strs := []string{"", "a", "ab", "b", "\u007f", "\u0080", "\u07ff", "\u0800", "\ud7ff",
		"\U00010000", "\U0001F600", "\U0010FFFF", "\ue000", "\uffff", "a\U00010000", "a\uffff"}
	utf16Less := func(a, b string) bool {
		ua, ub := toUTF16(a), toUTF16(b)
		for i := 0; i < len(ua) && i < len(ub); i++ {
			if ua[i] != ub[i] {
				return ua[i] < ub[i]
			}
		}
		return len(ua) < len(ub)
	}
	for _, a := range strs {
		for _, b := range strs {
			got := CompareUTF16(a, b)
			var want int
			switch {
			case a == b:
				want = 0
			case utf16Less(a, b):
				want = -1
			default:
				want = 1
			}
			if sign(got) != want {
				t.Errorf("CompareUTF16(%q, %q) = %d, want sign %d", a, b, got, want)
			}
		}
	}
}

func toUTF16(s string) []uint16 {
	var u []uint16
	for _, r := range s {
		if r >= 0x10000 {
			r -= 0x10000
			u = append(u, uint16(0xD800+(r>>10)), uint16(0xDC00+(r&0x3FF)))
		} else {
			u = append(u, uint16(r))
		}
	}
	return u
}

func sign(i int) int {
	switch {
	case i < 0:
		return -1
	case i > 0:
		return 1
	}
	return 0
}

func TestCanonicalJSONTypes(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   any
		want string
	}{
		{"nil", nil, "null"},
		{"true", true, "true"},
		{"false", false, "false"},
		{"empty object", map[string]any{}, "{}"},
		{"nil object", map[string]any(nil), "{}"},
		{"empty array", []any{}, "[]"},
		{"nil array", []any(nil), "[]"},
		{"int", 42, "42"},
		{"int64", int64(-7), "-7"},
		{"int64 2^53", int64(1 << 53), "9007199254740992"},
		{"json.Number", json.Number("1.50"), "1.5"},
		{"json.Number exp", json.Number("-1E+30"), "-1e+30"},
		{"json.Number -0", json.Number("-0"), "0"},
		{"json.Number underflow", json.Number("1e-400"), "0"},
		{"nested", map[string]any{
			"b": []any{1.0, "x", nil, map[string]any{"z": false, "y": []any{}}},
			"a": map[string]any{},
		}, `{"a":{},"b":[1,"x",null,{"y":[],"z":false}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mustCanonical(t, tc.in); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestCanonicalJSONErrors(t *testing.T) {
	const secret = "hunter2-SECRET"
	for _, tc := range []struct {
		name   string
		in     any
		path   string
		reveal []string // substrings that must not appear in the error
	}{
		{"NaN", map[string]any{"items": []any{0.0, 1.0, 2.0, map[string]any{"price": math.NaN(), "sku": secret}}},
			"/items/3/price", []string{secret}},
		{"+Inf", []any{math.Inf(1)}, "/0", []string{"+Inf"}},
		{"-Inf", map[string]any{"x": math.Inf(-1)}, "/x", []string{"-Inf"}},
		{"top-level NaN", math.NaN(), "", nil},
		{"invalid UTF-8 value", map[string]any{"card": secret + "\xff"}, "/card", []string{secret, `\xff`}},
		{"invalid UTF-8 surrogate", map[string]any{"a": []any{"\xed\xa0\x80" + secret}}, "/a/0", []string{secret}},
		{"invalid UTF-8 key", map[string]any{"o": map[string]any{secret + "\xff": 1.0}}, "/o", []string{secret}},
		{"unsupported type", map[string]any{"a": struct{ S string }{secret}}, "/a", []string{secret}},
		{"unsupported map type", map[string]any{"a": map[string]string{"k": secret}}, "/a", []string{secret}},
		{"float32", map[string]any{"a": float32(1.5)}, "/a", []string{"1.5"}},
		{"int too big", map[string]any{"n": int64(1<<53 + 1)}, "/n", []string{"9007199254740993"}},
		{"int too small", map[string]any{"n": int64(-(1<<53 + 1))}, "/n", []string{"9007199254740993"}},
		{"json.Number hex", map[string]any{"n": json.Number("0x1p4")}, "/n", []string{"0x1p4"}},
		{"json.Number NaN", map[string]any{"n": json.Number("NaN")}, "/n", nil},
		{"json.Number Inf", map[string]any{"n": json.Number("Infinity")}, "/n", []string{"Infinity"}},
		{"json.Number overflow", map[string]any{"n": json.Number("1e999")}, "/n", []string{"1e999"}},
		{"json.Number empty", map[string]any{"n": json.Number("")}, "/n", nil},
		{"json.Number leading zero", map[string]any{"n": json.Number("01")}, "/n", nil},
		{"escaped path", map[string]any{"a/b": map[string]any{"m~n": math.NaN()}}, "/a~1b/m~0n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Canonical(tc.in)
			if err == nil {
				t.Fatalf("Canonical = %s, want error", b)
			}
			if b != nil {
				t.Errorf("output %q returned with error", b)
			}
			if !errors.Is(err, ErrNotCanonical) {
				t.Errorf("error %v does not wrap ErrNotCanonical", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, strconv.Quote(tc.path)) {
				t.Errorf("error %q does not name path %q", msg, tc.path)
			}
			for _, s := range tc.reveal {
				if strings.Contains(msg, s) {
					t.Errorf("error %q reveals %q", msg, s)
				}
			}
		})
	}
}

// nestedArrays returns n nested arrays with leaf innermost.
func nestedArrays(n int, leaf any) any {
	v := leaf
	for range n {
		v = []any{v}
	}
	return v
}

func nestedObjects(n int, leaf any) any {
	v := leaf
	for range n {
		v = map[string]any{"k": v}
	}
	return v
}

func TestCanonicalJSONDepth(t *testing.T) {
	if MaxDepth != 64 {
		t.Fatalf("MaxDepth = %d, want 64", MaxDepth)
	}
	// MaxDepth containers are fine, with scalars inside the innermost.
	ok := []any{
		nestedArrays(MaxDepth, nil),
		nestedArrays(MaxDepth, "x"),
		nestedObjects(MaxDepth, 1.0),
		nestedArrays(MaxDepth-1, map[string]any{}),
	}
	for i, v := range ok {
		if _, err := Canonical(v); err != nil {
			t.Errorf("case %d: %v", i, err)
		}
	}
	want := strings.Repeat("[", MaxDepth) + "null" + strings.Repeat("]", MaxDepth)
	if got := mustCanonical(t, nestedArrays(MaxDepth, nil)); got != want {
		t.Errorf("got %s", got)
	}

	for _, tc := range []struct {
		v    any
		path string
	}{
		{nestedArrays(MaxDepth+1, nil), "/" + strings.Repeat("0/", MaxDepth-1) + "0"},
		{nestedArrays(MaxDepth, []any{}), "/" + strings.Repeat("0/", MaxDepth-1) + "0"},
		{nestedObjects(MaxDepth+1, 1.0), "/" + strings.Repeat("k/", MaxDepth-1) + "k"},
		{nestedArrays(1000, nil), "/" + strings.Repeat("0/", MaxDepth-1) + "0"},
	} {
		_, err := Canonical(tc.v)
		if !errors.Is(err, ErrNotCanonical) {
			t.Fatalf("got %v, want ErrNotCanonical", err)
		}
		if !strings.Contains(err.Error(), strconv.Quote(tc.path)) || !strings.Contains(err.Error(), "MaxDepth") {
			t.Errorf("error %q does not name path %q", err, tc.path)
		}
	}
}

func TestCanonicalJSONMatchesStdlibOnSimpleValues(t *testing.T) {
	// For ASCII-only keys, values without HTML characters and integers,
	// encoding/json (which sorts map keys bytewise) agrees with RFC 8785.
	v := decodeJSON(t, `{"b":[1,2,{"d":true,"c":null}],"a":"x y","e":{"f":-3}}`)
	std, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustCanonical(t, v); got != string(std) {
		t.Errorf("got %s, want %s", got, std)
	}
}

func TestCanonicalJSONKeySliceReuse(t *testing.T) {
	// Sibling objects at the same depth share the key buffer; make sure a
	// smaller object after a larger one is not polluted.
	v := []any{
		map[string]any{"a": 1.0, "b": 2.0, "c": map[string]any{"x": 1.0, "y": 2.0, "z": 3.0}},
		map[string]any{"d": map[string]any{"w": 0.0}},
		map[string]any{},
	}
	want := `[{"a":1,"b":2,"c":{"x":1,"y":2,"z":3}},{"d":{"w":0}},{}]`
	if got := mustCanonical(t, v); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestCanonicalJSONAllocs(t *testing.T) {
	v := decodeJSON(t, rfc8785Input)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Canonical(v); err != nil {
			t.Fatal(err)
		}
	})
	// Output buffer growth plus one key slice per depth; no per-value
	// allocations.
	if allocs > 10 {
		t.Errorf("Canonical allocated %v times per run", allocs)
	}
}

func BenchmarkCanonicalJSON(b *testing.B) {
	v := decodeJSON(b, `{"amount":1234.56,"currency":"EUR","items":[{"sku":"A-1","qty":2,"price":9.99},{"sku":"B-2","qty":1,"price":1e-7}],"memo":"Grüße \"quoted\"\n","meta":{"z":null,"y":true}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonical(v); err != nil {
			b.Fatal(err)
		}
	}
}

// jsonDepth returns the container nesting depth of a decoded JSON value.
func jsonDepth(v any) int {
	switch x := v.(type) {
	case map[string]any:
		d := 0
		for _, e := range x {
			d = max(d, jsonDepth(e))
		}
		return d + 1
	case []any:
		d := 0
		for _, e := range x {
			d = max(d, jsonDepth(e))
		}
		return d + 1
	}
	return 0
}

// normalizeNegZero replaces -0 with 0 throughout a decoded JSON value.
func normalizeNegZero(v any) any {
	switch x := v.(type) {
	case float64:
		if x == 0 {
			return 0.0
		}
	case map[string]any:
		for k, e := range x {
			x[k] = normalizeNegZero(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normalizeNegZero(e)
		}
	}
	return v
}

func addCanonicalSeeds(f *testing.F) {
	seeds := []string{
		rfc8785Input,
		rfc8785SortInput,
		`{}`, `[]`, `null`, `true`, `0`, `-0`, `"x"`,
		`{"a":1,"b":[1,2,3],"c":{"d":null}}`,
		`{"\ue000":1,"\ud83d\ude00":2,"\uffff":3,"a":4,"\u0080":5}`,
		`{"a/b":{"m~n":[1,{"":""}]}}`,
		`["\u0000\u0001\b\t\n\u000b\f\r\u001f","\"\\/","\u2028\u2029","\ud800","\udc00x","€𝄞"]`,
		`[1e21,999999999999999900000,999999999999999700000,1e-6,9.999999999999997e-7,1e-7,5e-324,-5e-324,1.7976931348623157e+308,9007199254740992,9007199254740993,0.1,1e+23,-0.0,1E-400]`,
		`[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001,-0.0000033333333333333333,1424953923781206.2]`,
		`{"a":1,"a":2}`,
		strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth),
		strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
		strings.Repeat(`{"k":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth),
		strings.Repeat(`{"k":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1),
		"{\"\xff\":\"\xfe\"}",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
}

func FuzzCanonicalJSON(f *testing.F) {
	addCanonicalSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var in any
		if err := json.Unmarshal(data, &in); err != nil {
			return
		}
		out, err := Canonical(in)
		if err != nil {
			// Decoded JSON holds only finite float64s and valid UTF-8
			// (encoding/json replaces invalid sequences with U+FFFD), so
			// the only possible refusal is the depth limit.
			if !errors.Is(err, ErrNotCanonical) {
				t.Fatalf("error does not wrap ErrNotCanonical: %v", err)
			}
			if jsonDepth(in) <= MaxDepth {
				t.Fatalf("refused value of depth %d: %v", jsonDepth(in), err)
			}
			return
		}
		if d := jsonDepth(in); d > MaxDepth {
			t.Fatalf("accepted value of depth %d", d)
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON output %q", out)
		}
		var back any
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("unmarshal output %q: %v", out, err)
		}
		if !reflect.DeepEqual(normalizeNegZero(in), normalizeNegZero(back)) {
			t.Fatalf("round trip changed value:\n in  %#v\n out %#v", in, back)
		}
		again, err := Canonical(back)
		if err != nil {
			t.Fatalf("re-canonicalizing %q: %v", out, err)
		}
		if !bytes.Equal(out, again) {
			t.Fatalf("not idempotent:\n%q\n%q", out, again)
		}
		// Canonical output contains no insignificant whitespace: compacting
		// must not change it.
		var compact bytes.Buffer
		if err := json.Compact(&compact, out); err != nil || !bytes.Equal(compact.Bytes(), out) {
			t.Fatalf("output %q is not compact", out)
		}
	})
}
