package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestFunctionsPart runs the functions part briefly on ledgerd binaries:
// both stacks answer every call, one Redis ran only FCALL and the other
// only EVALSHA, and the report has both rows. It asserts nothing about
// speed.
func TestFunctionsPart(t *testing.T) {
	var out, log bytes.Buffer
	rep, err := Run(context.Background(), Config{
		Ledgerd: ledgertest.LedgerdBinary(t, binDir), Only: []string{"functions"},
		Concurrency: 4, Warmup: 20 * time.Millisecond, Duration: 200 * time.Millisecond, Rounds: 1, Preload: 10,
		Dir: t.TempDir(), Out: &out, Log: &log,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	f := rep.Functions
	if f == nil {
		t.Fatalf("no functions part:\n%s", out.String())
	}
	for i, way := range []string{"fcall", "evalsha"} {
		if f.Reserve[i].Calls == 0 || f.Cycle[i].Calls == 0 || f.Commands[i][way] < f.Reserve[i].Calls {
			t.Errorf("%s: %d Reserves, %d cycles, Redis ran %v", way, f.Reserve[i].Calls, f.Cycle[i].Calls, f.Commands[i])
		}
	}
	for _, want := range []string{"functions: new-key Reserves", "FCALL", "EVALSHA", "FCALL ÷ EVALSHA"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
}
