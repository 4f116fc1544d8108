package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestInstructionsPart runs the instructions part with this test binary as
// the ledger's cycler and the stand-in peer (one SET per cycle): Redis
// executes more instructions per ledger cycle (two scripts) than per SET,
// more per cycle with a run id no run governs (an EXISTS), more again per
// cycle in a governed run (four scripts), and a peer module that does not
// build leaves the ledger's count and says why. Without valgrind the part
// says what to install. One call at a time: with more, how the cycler's
// calls batch follows the machine's load, and so does Redis's count per
// command (at 4, a busy machine once counted a cycle without a run id
// above one with).
func TestInstructionsPart(t *testing.T) {
	if err := callgrindOnPath(); err != nil {
		if required() {
			t.Fatalf("%v (LEDGER_TEST_POLYGLOT=require: make test installs it)", err)
		}
		t.Skipf("%v: skipped (make test installs it)", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		module      string
		unavailable string // in Instructions.Unavailable; empty: the peer measured
	}{
		{module: filepath.Join("testdata", "fakepeer")},
		{module: t.TempDir(), unavailable: "the peer: "},
	} {
		var out, log bytes.Buffer
		rep, err := Run(context.Background(), Config{
			Ledgerd: ledgertest.LedgerdBinary(t, binDir), Cycler: self, Only: []string{InstructionsKey}, PeerModule: c.module,
			Concurrency: 1, Duration: 100 * time.Millisecond, Rounds: 1, InstructionCycles: 200,
			Dir: t.TempDir(), Out: &out, Log: &log,
		})
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.module, err, log.String())
		}
		in := rep.Instructions
		if in == nil || in.Cycles != 200 || in.Ledger <= 0 {
			t.Fatalf("%s: the ledger unmeasured: %+v\n%s", c.module, in, out.String())
		}
		if c.unavailable != "" {
			if !strings.HasPrefix(in.Unavailable, c.unavailable) || in.Peer != 0 || !strings.Contains(out.String(), "the peer is not measured") {
				t.Errorf("%s: %+v:\n%s", c.module, in, out.String())
			}
			continue
		}
		if in.Unavailable != "" || in.Peer <= 0 || in.Ledger <= in.Peer || in.Ratio != in.Ledger/in.Peer {
			t.Errorf("%s: %+v; want the ledger's cycle above one SET", c.module, in)
		}
		if in.Governed <= in.Ledger {
			t.Errorf("%s: %+v; want a cycle in a governed run above one without", c.module, in)
		}
		// A count of 200 cycles varies by up to a tenth from run to run on a
		// busy machine (a slower run lets Redis's timers run more often),
		// about what a run id no run governs adds (8%): so the test holds
		// that cycle below a governed run's alone, and peer_test.go holds
		// what --ungoverned does.
		if in.Ungoverned <= 0 || in.Ungoverned >= in.Governed {
			t.Errorf("%s: %+v; want a cycle with a run id alone below one in a governed run", c.module, in)
		}
		t.Logf("%s: %+v", c.module, in)
		for _, want := range []string{"ledger in-process", "in runs of 20", "with run ids only", "peer in-process", "the ledger's ÷ the peer's", "(callgrind)"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("the report lacks %q:\n%s", want, out.String())
			}
		}
	}
}

// TestCallgrindTotal: a dump's totals line is read; a dump without one,
// or with a garbled one, is refused.
func TestCallgrindTotal(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		dump    string
		want    int64
		refused string
	}{
		{dump: "version: 1\nevents: Ir\nsummary: 949068337\ntotals: 949068337\n", want: 949068337},
		{dump: "events: Ir\nfn=(1) main\n16 3\ntotals: 12\n", want: 12},
		{dump: "events: Ir\n", refused: "no totals line"},
		{dump: "totals: many\n", refused: "totals"},
	} {
		p := filepath.Join(dir, "callgrind.out.1")
		if err := os.WriteFile(p, []byte(c.dump), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := callgrindTotal(p)
		if c.refused != "" {
			if err == nil || !strings.Contains(err.Error(), c.refused) {
				t.Errorf("%q: %d, %v; want an error with %q", c.dump, got, err, c.refused)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %d, %v; want %d", c.dump, got, err, c.want)
		}
	}
	if _, err := callgrindTotal(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing dump was read")
	}
}

// required reports whether a missing tool fails the test (make test) rather
// than skipping it (a plain go test).
func required() bool { return os.Getenv("LEDGER_TEST_POLYGLOT") == "require" }
