package bench

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestPairPart runs the pair part briefly: with two ledgerd binaries, each
// on its own Redis, both answer every call of every window and the report
// has a row for each;
// with a second binary that does not exist it fails naming it. It asserts
// nothing about speed.
func TestPairPart(t *testing.T) {
	bin := ledgertest.LedgerdBinary(t, binDir)
	missing := filepath.Join(t.TempDir(), "no-ledgerd")
	for _, tc := range []struct {
		name, against string
		err           string // "" when the part must succeed
	}{
		{"two binaries", bin, ""},
		{"missing second binary", missing, missing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, log bytes.Buffer
			rep, err := Run(context.Background(), Config{
				Ledgerd: bin, Against: tc.against, Only: []string{"pair"},
				Concurrency: 4, Warmup: 20 * time.Millisecond, Duration: 200 * time.Millisecond, Rounds: 2, Preload: 10,
				Dir: t.TempDir(), Out: &out, Log: &log,
			})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Run = %v, want an error naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, log.String())
			}
			p := rep.Pair
			if p == nil {
				t.Fatalf("no pair part:\n%s", out.String())
			}
			for i := range p.Binaries {
				if p.Reserve[i].Calls == 0 || p.Cycle[i].Calls == 0 || p.Reserve[i].Rounds != 2 {
					t.Errorf("binary %d: %d Reserves, %d cycles in %d rounds", i, p.Reserve[i].Calls, p.Cycle[i].Calls, p.Reserve[i].Rounds)
				}
			}
			for _, want := range []string{"pair: new-key Reserves", "--ledgerd " + bin, "--against " + bin, "--against ÷ --ledgerd", "Redis CPU per Reserve"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("the report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
