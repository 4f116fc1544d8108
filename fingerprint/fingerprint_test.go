package fingerprint

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

func decodeParams(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("json.Unmarshal(%q): %v", s, err)
	}
	return m
}

func mustFingerprint(t testing.TB, params map[string]any, fields []string) Fingerprint {
	t.Helper()
	fp, err := Compute(params, fields)
	if err != nil {
		t.Fatalf("Compute(%v): %v", fields, err)
	}
	return fp
}

func TestFingerprintStringParse(t *testing.T) {
	fp := Fingerprint(sha256.Sum256([]byte("abc")))
	const want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := fp.String(); got != want {
		t.Fatalf("String = %s, want %s", got, want)
	}
	for _, s := range []string{want, strings.ToUpper(want)} {
		got, err := Parse(s)
		if err != nil || got != fp {
			t.Errorf("Parse(%q) = %v, %v", s, got, err)
		}
	}
	for _, s := range []string{"", want[:63], want + "0", want[:62] + "zz", want[:63] + " ", "0x" + want[:62], want[:32] + "\xff" + want[33:]} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) succeeded", s)
		}
	}
	if got := (Fingerprint{}).String(); got != strings.Repeat("0", 64) {
		t.Errorf("zero fingerprint = %s", got)
	}
}

func TestComputeFingerprintKnownAnswers(t *testing.T) {
	params := decodeParams(t, `{"currency":"EUR","amount":12.50,"note":"x","items":[{"sku":"A","qty":2}]}`)
	for _, tc := range []struct {
		name      string
		params    map[string]any
		fields    []string
		canonical string
	}{
		{"whole", params, nil,
			`{"amount":12.5,"currency":"EUR","items":[{"qty":2,"sku":"A"}],"note":"x"}`},
		{"empty fields", params, []string{},
			`{"amount":12.5,"currency":"EUR","items":[{"qty":2,"sku":"A"}],"note":"x"}`},
		{"fields", params, []string{"/currency", "/amount", "/memo"},
			`{"/amount":12.5,"/currency":"EUR"}`},
		{"nested field", params, []string{"/items/0/sku", "/items/0"},
			`{"/items/0":{"qty":2,"sku":"A"},"/items/0/sku":"A"}`},
		{"root pointer", params, []string{""},
			`{"":{"amount":12.5,"currency":"EUR","items":[{"qty":2,"sku":"A"}],"note":"x"}}`},
		{"nothing selected", params, []string{"/nope"}, `{}`},
		{"nil params", nil, nil, `{}`},
		{"nil params fields", nil, []string{"/a", ""}, `{"":{}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := Fingerprint(sha256.Sum256([]byte(tc.canonical)))
			if got := mustFingerprint(t, tc.params, tc.fields); got != want {
				t.Errorf("fingerprint %s, want sha256(%s) = %s", got, tc.canonical, want)
			}
		})
	}
	// A fixed hex value, so that a change in the algorithm is noticed even if
	// the canonical string above were changed with it.
	const emptyObjectSHA256 = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
	if got := mustFingerprint(t, map[string]any{}, nil).String(); got != emptyObjectSHA256 {
		t.Errorf("fingerprint of {} = %s, want %s", got, emptyObjectSHA256)
	}
}

func TestComputeFingerprintKeyOrder(t *testing.T) {
	a := decodeParams(t, `{"amount":100,"currency":"USD","to":{"iban":"DE89","name":"Ann"},"tags":["x","y"]}`)
	b := decodeParams(t, `{ "tags" : ["x","y"], "to":{"name":"Ann","iban":"DE89"}, "currency":"USD", "amount":1e2 }`)
	if fa, fb := mustFingerprint(t, a, nil), mustFingerprint(t, b, nil); fa != fb {
		t.Errorf("same params in different order: %s != %s", fa, fb)
	}
	fields := []string{"/amount", "/to/iban"}
	if fa, fb := mustFingerprint(t, a, fields), mustFingerprint(t, b, []string{"/to/iban", "/amount", "/amount"}); fa != fb {
		t.Errorf("field order/duplicates changed fingerprint: %s != %s", fa, fb)
	}
}

func TestComputeFingerprintChanges(t *testing.T) {
	base := `{"amount":100,"currency":"USD","memo":"rent","items":[{"sku":"A","price":1.5}]}`
	fields := []string{"/amount", "/currency", "/items/0/price"}
	fpAll := mustFingerprint(t, decodeParams(t, base), nil)
	fpSel := mustFingerprint(t, decodeParams(t, base), fields)
	for _, tc := range []struct {
		name       string
		params     string
		sameAll    bool
		sameFields bool
	}{
		{"amount changed", `{"amount":101,"currency":"USD","memo":"rent","items":[{"sku":"A","price":1.5}]}`, false, false},
		{"amount as string", `{"amount":"100","currency":"USD","memo":"rent","items":[{"sku":"A","price":1.5}]}`, false, false},
		{"nested price changed", `{"amount":100,"currency":"USD","memo":"rent","items":[{"sku":"A","price":1.25}]}`, false, false},
		{"memo changed", `{"amount":100,"currency":"USD","memo":"food","items":[{"sku":"A","price":1.5}]}`, false, true},
		{"sku changed", `{"amount":100,"currency":"USD","memo":"rent","items":[{"sku":"B","price":1.5}]}`, false, true},
		{"extra field", `{"amount":100,"currency":"USD","memo":"rent","items":[{"sku":"A","price":1.5}],"x":1}`, false, true},
		{"same number written differently", `{"amount":1.00e2,"currency":"USD","memo":"rent","items":[{"sku":"A","price":15e-1}]}`, true, true},
		{"currency removed", `{"amount":100,"memo":"rent","items":[{"sku":"A","price":1.5}]}`, false, false},
		{"currency null", `{"amount":100,"currency":null,"memo":"rent","items":[{"sku":"A","price":1.5}]}`, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := decodeParams(t, tc.params)
			if got := mustFingerprint(t, p, nil) == fpAll; got != tc.sameAll {
				t.Errorf("whole-params fingerprint equal = %v, want %v", got, tc.sameAll)
			}
			if got := mustFingerprint(t, p, fields) == fpSel; got != tc.sameFields {
				t.Errorf("selected-fields fingerprint equal = %v, want %v", got, tc.sameFields)
			}
		})
	}
}

func TestComputeFingerprintMissingVersusNull(t *testing.T) {
	fields := []string{"/a", "/b"}
	missing := mustFingerprint(t, decodeParams(t, `{"a":1}`), fields)
	null := mustFingerprint(t, decodeParams(t, `{"a":1,"b":null}`), fields)
	if missing == null {
		t.Error("missing and null fields give the same fingerprint")
	}
	if want := Fingerprint(sha256.Sum256([]byte(`{"/a":1,"/b":null}`))); null != want {
		t.Errorf("null: got %s, want %s", null, want)
	}
	if want := Fingerprint(sha256.Sum256([]byte(`{"/a":1}`))); missing != want {
		t.Errorf("missing: got %s, want %s", missing, want)
	}
}

func TestComputeFingerprintPointers(t *testing.T) {
	params := decodeParams(t, `{
		"a/b": 1, "m~n": 2, "~1": 3, "": 4, " ": 5, "%25": 6, "\u00e9": 7,
		"arr": [10, 11, {"k": 12}], "obj": {"0": "zero", "01": "zero-one", "-": "dash"},
		"s": "str", "z": null
	}`)
	for _, tc := range []struct {
		ptr  string
		want string // canonical JSON of the selected value; "" = nothing
	}{
		{"/a~1b", "1"},
		{"/m~0n", "2"},
		{"/~01", "3"}, // ~01 unescapes to "~1", not "/" (RFC 6901 section 4)
		{"/a/b", ""},
		{"/", "4"},
		{"/ ", "5"},
		{"/%25", "6"},
		{"/\u00e9", "7"},
		{"/arr/0", "10"},
		{"/arr/2/k", "12"},
		{"/arr/3", ""},
		{"/arr/-", ""},
		{"/arr/01", ""},
		{"/arr/+1", ""},
		{"/arr/-1", ""},
		{"/arr/1.0", ""},
		{"/arr/", ""},
		{"/arr/99999999999999999999999999", ""},
		{"/obj/0", `"zero"`},
		{"/obj/01", `"zero-one"`},
		{"/obj/-", `"dash"`},
		{"/s/0", ""},
		{"/z", "null"},
		{"/z/x", ""},
		{"/missing", ""},
	} {
		t.Run(tc.ptr, func(t *testing.T) {
			canonical := "{}"
			if tc.want != "" {
				canonical = "{" + mustCanonical(t, tc.ptr) + ":" + tc.want + "}"
			}
			want := Fingerprint(sha256.Sum256([]byte(canonical)))
			if got := mustFingerprint(t, params, []string{tc.ptr}); got != want {
				t.Errorf("fingerprint %s, want sha256(%s)", got, canonical)
			}
		})
	}
}

func TestComputeFingerprintSelectionOrderUTF16(t *testing.T) {
	// The selection object's members (pointer strings) are sorted by UTF-16
	// code units too.
	params := map[string]any{"\ue000": 1.0, "\U0001F600": 2.0}
	got := mustFingerprint(t, params, []string{"/\ue000", "/\U0001F600"})
	want := Fingerprint(sha256.Sum256([]byte("{\"/\U0001F600\":2,\"/\ue000\":1}")))
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestValidatePointer(t *testing.T) {
	valid := []string{"", "/", "//", "/a", "/a/b", "/~0", "/~1", "/a~0b~1c", "/items/0/sku", "/-", "/\u00e9", "/ "}
	for _, p := range valid {
		if err := ValidatePointer(p); err != nil {
			t.Errorf("ValidatePointer(%q) = %v", p, err)
		}
	}
	invalid := []string{"a", "a/b", "#/a", " /a", "/~", "/~2", "/a~", "/~a", "/~~0", "/\xff", "~0"}
	for _, p := range invalid {
		err := ValidatePointer(p)
		if !errors.Is(err, ErrInvalidPointer) {
			t.Errorf("ValidatePointer(%q) = %v, want ErrInvalidPointer", p, err)
		}
		if _, err := Compute(map[string]any{"a": 1.0}, []string{"/a", p}); !errors.Is(err, ErrInvalidPointer) {
			t.Errorf("Compute with %q = %v, want ErrInvalidPointer", p, err)
		}
	}
}

func TestComputeFingerprintErrors(t *testing.T) {
	const secret = "SECRET-42"
	params := map[string]any{
		"items": []any{map[string]any{"price": math.NaN(), "sku": secret}},
		"note":  secret + "\xff",
		"ok":    1.0,
	}
	// Whole params: refused, path named, value not revealed.
	_, err := Compute(params, nil)
	if !errors.Is(err, ErrNotCanonical) || strings.Contains(err.Error(), secret) {
		t.Errorf("whole params: %v", err)
	}
	// Selected bad field: path is relative to params.
	for _, tc := range []struct {
		fields []string
		path   string
	}{
		{[]string{"/items/0/price"}, "/items/0/price"},
		{[]string{"/items/0"}, "/items/0/price"},
		{[]string{"/items"}, "/items/0/price"},
		{[]string{"/ok", "/note"}, "/note"},
	} {
		_, err := Compute(params, tc.fields)
		if !errors.Is(err, ErrNotCanonical) {
			t.Fatalf("%v: got %v, want ErrNotCanonical", tc.fields, err)
		}
		if !strings.Contains(err.Error(), strconv.Quote(tc.path)) || strings.Contains(err.Error(), secret) {
			t.Errorf("%v: error %q, want path %q and no value", tc.fields, err, tc.path)
		}
	}
	// Non-consequential bad fields are ignored.
	if _, err := Compute(params, []string{"/ok", "/items/0/sku"}); err != nil {
		t.Errorf("unselected bad values refused: %v", err)
	}
}

// TestComputeFingerprintEncoderReuse checks that Compute, which reuses its
// encoders, answers each call as if it were the first: after a refusal
// mid-object, after a larger object, and after a selection.
func TestComputeFingerprintEncoderReuse(t *testing.T) {
	small := map[string]any{"b": 1.0, "a": "x"}
	want := sha256.Sum256([]byte(`{"a":"x","b":1}`))
	for _, tc := range []struct {
		name   string
		params map[string]any
		fields []string
	}{
		{"refused mid-object", map[string]any{"a": 1.0, "m": map[string]any{"k": math.NaN(), "l": 2.0}, "z": 3.0}, nil},
		{"larger object", map[string]any{"a": 1.0, "b": map[string]any{"c": []any{1.0, "long string value"}}, "d": strings.Repeat("y", 300)}, nil},
		{"selection", map[string]any{"a": 1.0, "b": 2.0}, []string{"/b"}},
	} {
		for range 3 {
			_, _ = Compute(tc.params, tc.fields)
			if got, err := Compute(small, nil); err != nil || Fingerprint(want) != got {
				t.Fatalf("after %s: got %x, %v; want %x", tc.name, got, err, want)
			}
		}
	}
}

func TestComputeFingerprintDepth(t *testing.T) {
	// A params object whose deepest container is at MaxDepth is
	// accepted whichever fields are selected; one level more is refused.
	okParams := nestedObjects(MaxDepth, 1.0).(map[string]any)
	deepPtr := strings.Repeat("/k", MaxDepth-1) // innermost container
	for _, fields := range [][]string{nil, {""}, {"/k"}, {deepPtr}, {deepPtr + "/k"}} {
		if _, err := Compute(okParams, fields); err != nil {
			t.Errorf("depth %d, fields %.20q: %v", MaxDepth, fields, err)
		}
	}
	tooDeep := nestedObjects(MaxDepth+1, 1.0).(map[string]any)
	for _, fields := range [][]string{nil, {""}, {"/k"}, {deepPtr}, {deepPtr + "/k"}, {deepPtr + "/k/k"}} {
		if _, err := Compute(tooDeep, fields); !errors.Is(err, ErrNotCanonical) {
			t.Errorf("depth %d, fields %.20q: got %v, want ErrNotCanonical", MaxDepth+1, fields, err)
		}
	}
	// Selecting a scalar inside an allowed depth is fine even with deep
	// siblings elsewhere.
	mixed := map[string]any{"deep": nestedArrays(200, nil), "x": 1.0}
	if _, err := Compute(mixed, []string{"/x"}); err != nil {
		t.Errorf("unselected deep sibling refused: %v", err)
	}
	if _, err := Compute(mixed, nil); !errors.Is(err, ErrNotCanonical) {
		t.Errorf("deep params accepted: %v", err)
	}
}

// referenceSelect resolves pointer p against root in the most direct way
// (split, unescape, walk), as an independent check of resolvePointer.
func referenceSelect(root any, p string) (any, bool) {
	if p == "" {
		return root, true
	}
	cur := root
	for _, tok := range strings.Split(p[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[tok]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) || strconv.Itoa(i) != tok {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

func FuzzComputeFingerprint(f *testing.F) {
	for _, s := range []struct{ doc, ptr string }{
		{rfc8785Input, "/numbers/1"},
		{rfc8785Input, "/string"},
		{rfc8785SortInput, "/\u20ac"},
		{rfc8785SortInput, "/\U0001F600"},
		{`{"a/b":{"m~n":[1,2]}}`, "/a~1b/m~0n/1"},
		{`{"a":[1,2,3]}`, "/a/01"},
		{`{"a":[1,2,3]}`, "/a/-"},
		{`{"a":[1,2,3]}`, "/a/99999999999999999999"},
		{`{"a":null}`, "/a"},
		{`{"a":null}`, "/b"},
		{`{}`, ""},
		{`{"":{"":1}}`, "//"},
		{`{"a":1}`, "/~2"},
		{`{"a":1}`, "a"},
		{`{"a":"\u0000\u2028"}`, "/a"},
		{`{"n":[1e21,1e-7,-0,5e-324]}`, "/n"},
		{strings.Repeat(`{"k":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1), strings.Repeat("/k", MaxDepth)},
		{strings.Repeat(`{"k":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth), strings.Repeat("/k", MaxDepth-1)},
	} {
		f.Add([]byte(s.doc), s.ptr)
	}
	f.Fuzz(func(t *testing.T, data []byte, ptr string) {
		var params map[string]any
		if err := json.Unmarshal(data, &params); err != nil {
			return
		}
		fields := []string{ptr}
		whole1, errW1 := Compute(params, nil)
		whole2, errW2 := Compute(params, nil)
		sel1, errS1 := Compute(params, fields)
		sel2, errS2 := Compute(params, fields)
		if whole1 != whole2 || (errW1 == nil) != (errW2 == nil) {
			t.Fatal("whole-params fingerprint not deterministic")
		}
		if sel1 != sel2 || (errS1 == nil) != (errS2 == nil) {
			t.Fatal("selected-fields fingerprint not deterministic")
		}
		if errW1 != nil && !errors.Is(errW1, ErrNotCanonical) {
			t.Fatalf("unexpected error %v", errW1)
		}
		if ValidatePointer(ptr) != nil {
			if !errors.Is(errS1, ErrInvalidPointer) {
				t.Fatalf("invalid pointer %q: got %v", ptr, errS1)
			}
			return
		}
		if errS1 != nil {
			// Only the depth limit can refuse decoded JSON.
			if !errors.Is(errS1, ErrNotCanonical) || jsonDepth(params) <= MaxDepth {
				t.Fatalf("pointer %q: unexpected error %v", ptr, errS1)
			}
			return
		}
		// Independent computation: build the selection object and hash its
		// canonical form.
		sel := map[string]any{}
		if v, ok := referenceSelect(map[string]any(params), ptr); ok {
			if params == nil && ptr == "" {
				v = map[string]any{}
			}
			sel[ptr] = v
		}
		b, err := Canonical(sel)
		if err != nil {
			// The selection object adds one level of nesting.
			if jsonDepth(sel) <= MaxDepth {
				t.Fatalf("reference canonicalization failed: %v", err)
			}
			return
		}
		if want := Fingerprint(sha256.Sum256(b)); sel1 != want {
			t.Fatalf("pointer %q: fingerprint %s, want sha256(%q)", ptr, sel1, b)
		}
		if errW1 == nil && ptr == "" {
			// {"": params} is not the same document as params.
			if whole1 == sel1 {
				t.Fatal("root pointer selection equals whole-params fingerprint")
			}
		}
	})
}

// TestResolve: Resolve selects what Compute's pointers select: members
// (~1 and ~0 unescaped), array indices without leading zeros, the root for
// ""; an invalid pointer, or a miss, selects nothing.
func TestResolve(t *testing.T) {
	root := map[string]any{"a/b": 1.0, "m~n": 2.0, "to": map[string]any{"iban": "X"}, "list": []any{"p", "q"}}
	for _, tc := range []struct {
		p     string
		want  any
		found bool
	}{
		{"/a~1b", 1.0, true}, {"/m~0n", 2.0, true}, {"/to/iban", "X", true}, {"/list/1", "q", true},
		{"/list/01", nil, false}, {"/list/2", nil, false}, {"/list/-", nil, false}, {"/missing", nil, false},
		{"/to/iban/x", nil, false}, {"to", nil, false}, {"/~2", nil, false},
	} {
		got, found := Resolve(root, tc.p)
		if found != tc.found || found && got != tc.want {
			t.Errorf("Resolve(%q) = %v, %v; want %v, %v", tc.p, got, found, tc.want, tc.found)
		}
	}
	if got, found := Resolve(root, ""); !found || got.(map[string]any)["to"] == nil {
		t.Errorf("Resolve(\"\") = %v, %v; want the root", got, found)
	}
}
