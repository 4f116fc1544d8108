package bench

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestBarePairPart runs the bare pair part briefly, with this test binary
// as the bare server (TestMain): ledgerd and the bare server both answer
// every call of every window, each on its own Redis, and the report has
// their rows, the ratio and its goal. It asserts nothing about speed.
func TestBarePairPart(t *testing.T) {
	var out, log bytes.Buffer
	rep, err := Run(context.Background(), Config{
		Ledgerd: ledgertest.LedgerdBinary(t, binDir), BareServer: os.Args[0], Only: []string{BarePairKey},
		Concurrency: 4, Warmup: 20 * time.Millisecond, Duration: 500 * time.Millisecond, Rounds: 2, Preload: 10,
		Dir: t.TempDir(), Out: &out, Log: &log,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	p := rep.BarePair
	if p == nil {
		t.Fatalf("no bare pair part:\n%s", out.String())
	}
	if p.Reserve.Calls == 0 || p.Bare.Calls == 0 || p.Reserve.Rounds != 2 || p.Bare.Rounds != 2 {
		t.Errorf("%d Reserves and %d bare calls in %d and %d rounds", p.Reserve.Calls, p.Bare.Calls, p.Reserve.Rounds, p.Bare.Rounds)
	}
	// Each server's CPU is counted (half a second of calls is many ticks).
	if p.Reserve.CPU.Ledgerd == 0 || p.Bare.CPU.Ledgerd == 0 || p.Ratio <= 0 {
		t.Errorf("CPU not counted: ledgerd %v, the bare server %v, ratio %v", p.Reserve.CPU.Ledgerd, p.Bare.CPU.Ledgerd, p.Ratio)
	}
	for _, want := range []string{"bare pair: ledgerd's new-key Reserves", "ledgerd (Reserve)", "bare server", "÷ the bare server's per call",
		"ledgerd CPU per new-key Reserve ÷ the bare server's, at once"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
}
