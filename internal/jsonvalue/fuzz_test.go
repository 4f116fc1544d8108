package jsonvalue

import (
	"errors"
	"math"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/opledger/ledger/fingerprint"
)

// FuzzParams holds the conversion of Go-typed params to what it promises:
// a string is kept as it is or refused when it is not valid UTF-8 (never
// sent with its bytes replaced); an integer is kept exactly as written or
// refused (never rounded into another integer's request); a finite float64
// is the double it is; and the converted params fingerprint as the same
// values built from JSON values do.
func FuzzParams(f *testing.F) {
	f.Add("refund", int64(1250), 12.5, "ch_1")
	f.Add("caf\xe9", int64(1)<<53+1, 1e20, `\ufffd`)
	f.Add("\ufffd", int64(1152921504606847000), math.MaxFloat64, "")
	f.Add(`\\`+"\xff", int64(-1)<<62-1, 5e-324, "k\x00")
	f.Fuzz(func(t *testing.T, s string, n int64, x float64, key string) {
		// A string, in a slice and as a map key.
		out, err := Params(map[string]any{"s": []string{s}, "m": map[string]string{key: s}})
		valid := utf8.ValidString(s) && utf8.ValidString(key)
		if valid != (err == nil) || err != nil && !errors.Is(err, fingerprint.ErrNotCanonical) {
			t.Fatalf("Params(%q, %q) = %v; valid UTF-8: %v", s, key, err, valid)
		}
		if err == nil {
			want, werr := fingerprint.Canonical(map[string]any{"s": []any{s}, "m": map[string]any{key: s}})
			got, gerr := fingerprint.Canonical(out)
			if werr != nil || gerr != nil || string(got) != string(want) {
				t.Fatalf("Params(%q, %q) = %s (%v), want %s (%v)", s, key, got, gerr, want, werr)
			}
		}

		// An integer: exactly as written, or refused.
		out, err = Params(map[string]any{"n": []int64{n}})
		if err != nil && !errors.Is(err, fingerprint.ErrNotCanonical) {
			t.Fatalf("Params(%d): %v", n, err)
		}
		if -1<<53 <= n && n <= 1<<53 && err != nil {
			t.Fatalf("Params(%d) refused an integer every double carries: %v", n, err)
		}
		if err == nil {
			got, cerr := fingerprint.Canonical(out)
			if want := `{"n":[` + strconv.FormatInt(n, 10) + `]}`; cerr != nil || string(got) != want {
				t.Fatalf("Params(%d) fingerprints as %s (%v), want %s", n, got, cerr, want)
			}
		}

		// A float64: the double it is, or refused when JSON has no form
		// for it.
		out, err = Params(map[string]any{"x": []float64{x}})
		finite := !math.IsNaN(x) && !math.IsInf(x, 0)
		if finite != (err == nil) {
			t.Fatalf("Params(%v) = %v; finite: %v", x, err, finite)
		}
		if err == nil {
			want, werr := fingerprint.Canonical(map[string]any{"x": []any{x}})
			got, gerr := fingerprint.Canonical(out)
			if werr != nil || gerr != nil || string(got) != string(want) {
				t.Fatalf("Params(%v) = %s (%v), want %s (%v)", x, got, gerr, want, werr)
			}
		}
	})
}
