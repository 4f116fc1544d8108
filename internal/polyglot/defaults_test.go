package polyglot

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
)

// TestExamplesToolTimeoutDefault checks that the Node and Python examples
// give a tool, by default, as long to return as the Go SDK does
// (client.DefaultToolPolicy.Timeout), and that their READMEs say so.
func TestExamplesToolTimeoutDefault(t *testing.T) {
	t.Parallel()
	want := client.DefaultToolPolicy.Timeout
	for _, c := range []struct {
		file, pattern string
		unit          time.Duration
	}{
		{"examples/node/ledger.js", `toolTimeoutMs = (\d+)\b`, time.Millisecond},
		{"examples/node/README.md", `\(([\d.]+)\s+s\s+if\s+not\s+given\)`, time.Second},
		{"examples/node/README.md", "`toolTimeoutMs`\\s+\\(([\\d.]+)\\s+s\\s+unless", time.Second},
		{"examples/python/ledger_guard.py", `tool_timeout: float = ([\d.]+)`, time.Second},
		{"examples/python/README.md", `\(([\d.]+)\s+s\s+if\s+not\s+given\)`, time.Second},
		{"examples/python/README.md", "`tool_timeout`\\s+seconds\\s+\\(([\\d.]+)\\s+unless", time.Second},
	} {
		text, err := os.ReadFile(filepath.Join(repoRoot(t), c.file))
		if err != nil {
			t.Fatal(err)
		}
		found := regexp.MustCompile(c.pattern).FindAllStringSubmatch(string(text), -1)
		if len(found) == 0 {
			t.Errorf("%s: no default tool timeout matching %q", c.file, c.pattern)
		}
		for _, m := range found {
			v, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", c.file, m[0], err)
			}
			if got := time.Duration(v * float64(c.unit)); got != want {
				t.Errorf("%s: %q is a default tool timeout of %s; the Go SDK's is %s", c.file, m[0], got, want)
			}
		}
	}
}
