package jsonvalue

import (
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
