package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// TestRunCycle: the ledger's cycler with a count runs exactly that many
// cycles, says so in the protocol's end line, and leaves each operation
// SUCCEEDED with the cycle's result; with run steps, each operation is a
// step of its run, and every run counts its steps, none left open;
// ungoverned, each operation carries its run id and no run exists.
func TestRunCycle(t *testing.T) {
	for _, c := range []struct {
		runSteps   int64
		ungoverned bool
		runs       []int // each run's steps; nil: no runs
	}{
		{},
		{runSteps: 10, runs: []int{10, 10, 5}},
		{runSteps: 10, ungoverned: true, runs: []int{10, 10, 5}},
	} {
		srv := redistest.Start(t)
		var out bytes.Buffer
		o := CycleOptions{RedisAddr: srv.Addr, Prefix: "t", Concurrency: 4, Count: 25, RunSteps: c.runSteps, Ungoverned: c.ungoverned}
		if err := RunCycle(context.Background(), o, &out); err != nil {
			t.Fatal(err)
		}
		res, err := readCycler(&out, "cycle", 0, 0)
		if err != nil || res.Calls != 25 || res.Errors != 0 {
			t.Fatalf("readCycler(%q) = %+v, %v; want 25 cycles", out.String(), res, err)
		}
		l, err := ledger.New(srv.Client(t), ledger.Options{Prefix: InprocPrefix})
		if err != nil {
			t.Fatal(err)
		}
		for seq := int64(1); seq <= 26; seq++ {
			id := OperationID("t", seq)
			op, err := l.Lookup(context.Background(), bareWho, id)
			switch {
			case seq == 26:
				if ledger.KindOf(err) == ledger.KindNotFound {
					continue
				}
				t.Fatalf("Lookup(%s) beyond the count = %v, %v; want not found", id, op, err)
			case err != nil:
				t.Fatalf("Lookup(%s): %v", id, err)
			case op.State != ledger.StateSucceeded || !bytes.Equal(op.Result.Data, resultData):
				t.Fatalf("Lookup(%s) = %v with %q", id, op.State, op.Result.Data)
			case c.runs != nil && op.RunID != runOf("t", (seq-1)/c.runSteps):
				t.Fatalf("Lookup(%s) in run %q", id, op.RunID)
			case c.runs == nil && op.RunID != "":
				t.Fatalf("Lookup(%s) in run %q, want none", id, op.RunID)
			}
		}
		for n, steps := range c.runs {
			run, err := l.GetRun(context.Background(), bareWho, runOf("t", int64(n)))
			if c.ungoverned {
				if ledger.KindOf(err) != ledger.KindNotFound {
					t.Fatalf("ungoverned run %d: %+v, %v; want not found", n, run, err)
				}
				continue
			}
			if err != nil || run.State != ledger.RunStateRunning || run.Steps != steps || run.Open != 0 {
				t.Fatalf("run %d: %+v, %v; want running, %d steps, none open", n, run, err, steps)
			}
		}
	}
}

// TestReadCycler: the protocol's lines make a Result; a cycler that fails
// a cycle names the failure, and one that ends early or garbles its end
// line is refused.
func TestReadCycler(t *testing.T) {
	for _, c := range []struct {
		in      string
		calls   int64
		errs    int64
		first   string
		refused string
	}{
		{in: "start\nend 120 0 2000000000\n", calls: 120},
		{in: "start\nerror Reserve: boom\nend 7 3 1000\n", calls: 7, errs: 3, first: "Reserve: boom"},
		{in: "noise\nstart\nend 1 0 5\ntrailing\n", calls: 1},
		{in: "start\n", refused: "ended without its end line"},
		{in: "", refused: "ended without its end line"},
		{in: "start\nend x 0 1\n", refused: "its end line"},
		{in: "start\nend 1 0\n", refused: "its end line"},
	} {
		res, err := readCycler(strings.NewReader(c.in), "w", 0, 0)
		if c.refused != "" {
			if err == nil || !strings.Contains(err.Error(), c.refused) {
				t.Errorf("%q: %+v, %v; want an error with %q", c.in, res, err, c.refused)
			}
			continue
		}
		if err != nil || res.Calls != c.calls || res.Errors != c.errs || fmt.Sprint(res.FirstErr) != fmt.Sprint(map[bool]any{true: nil, false: c.first}[c.first == ""]) {
			t.Errorf("%q: %+v, %v; want %d calls, %d errors, first %q", c.in, res, err, c.calls, c.errs, c.first)
		}
	}
}

// TestPeerPart runs the peer part briefly on a ledgerd binary, with this
// test binary as the ledger's cycler: with a stand-in peer module (each
// cycle one SET) every way has cycles and the goals are printed; with a
// peer module that does not build, the ledger's ways are still measured
// and the report says why the peer is not. It asserts nothing about speed.
func TestPeerPart(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		module      string
		unavailable string // in Peer.Unavailable; empty: the peer measured
	}{
		{module: filepath.Join("testdata", "fakepeer")},
		{module: t.TempDir(), unavailable: "go.mod"},
	} {
		var out, log bytes.Buffer
		rep, err := Run(context.Background(), Config{
			Ledgerd: ledgertest.LedgerdBinary(t, binDir), Cycler: self, Only: []string{"peer"}, PeerModule: c.module,
			Concurrency: 4, Warmup: 20 * time.Millisecond, Duration: 200 * time.Millisecond, Rounds: 1, Preload: 10, MemoryRecords: 200,
			Dir: t.TempDir(), Out: &out, Log: &log,
		})
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.module, err, log.String())
		}
		p := rep.Peer
		if p == nil || p.Cycle[0] == nil || p.Cycle[0].Calls == 0 || p.Cycle[2] == nil || p.Cycle[2].Calls == 0 || p.Memory[0] <= 0 {
			t.Fatalf("%s: the ledger's ways unmeasured: %+v\n%s", c.module, p, out.String())
		}
		if c.unavailable != "" {
			if !strings.Contains(p.Unavailable, c.unavailable) || p.Cycle[1] != nil || !strings.Contains(out.String(), "the peer is not measured") {
				t.Errorf("%s: Unavailable %q, peer row %+v:\n%s", c.module, p.Unavailable, p.Cycle[1], out.String())
			}
			continue
		}
		if p.Unavailable != "" || p.Cycle[1] == nil || p.Cycle[1].Calls == 0 || p.InprocRatio <= 0 || p.RedisRatio <= 0 {
			t.Fatalf("%s: the peer unmeasured: %+v\n%s\n%s", c.module, p, out.String(), log.String())
		}
		for _, want := range []string{"ledger in-process", "peer in-process", "ledger over gRPC", "÷ the peer in-process", "the peer's in-process"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("the report lacks %q:\n%s", want, out.String())
			}
		}
	}
}

// TestGoError: the go command's first error, on one line with its
// continuation, without the progress lines.
func TestGoError(t *testing.T) {
	exit := errors.New("exit status 1")
	for _, c := range []struct{ out, want string }{
		{"go: downloading golang.org/x/sys v0.45.0\ngo: example.com/m@v1: reading https://proxy.golang.org/example.com/m/@v/v1.info: 403 Forbidden\n\tserver response: This module version is not available.\n",
			"go: example.com/m@v1: reading https://proxy.golang.org/example.com/m/@v/v1.info: 403 Forbidden server response: This module version is not available."},
		{"./main.go:3:1: syntax error\n", "./main.go:3:1: syntax error"},
		{"main.go:26:2: example.com/m@v1: 403 Forbidden\n\tserver response: not available.\nmain.go:27:2: example.com/m@v1: 403 Forbidden\n\tserver response: not available.\n",
			"main.go:26:2: example.com/m@v1: 403 Forbidden server response: not available."},
		{"go: downloading example.com/m v1\n", "exit status 1"},
		{"", "exit status 1"},
	} {
		if got := goError(c.out, exit); got != c.want {
			t.Errorf("goError(%q) = %q, want %q", c.out, got, c.want)
		}
	}
}
