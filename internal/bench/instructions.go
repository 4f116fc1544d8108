package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// InstructionsKey selects the instructions part (Config.Only).
const InstructionsKey = "instructions"

// Instructions is the instructions part's report: the instructions Redis
// executes per Reserve+Complete cycle, counted by callgrind, for the
// ledger's cycler and the peer's.
type Instructions struct {
	// Cycles is how many cycles each count spans.
	Cycles int64
	// Ledger and Peer are instructions per cycle; Peer is zero when the
	// peer was not measured.
	Ledger, Peer float64
	// Governed is the ledger's, each operation a step of a run of
	// RunSteps under an implicit run policy (the run guard's two scripts
	// more per cycle).
	Governed float64
	// Ungoverned is the ledger's, each Reserve with a run id that no run
	// governs (an EXISTS more per cycle).
	Ungoverned float64
	// Ratio is Ledger ÷ Peer; zero without the peer.
	Ratio float64
	// Unavailable says why nothing (no valgrind) or the peer (it does not
	// build) was not measured; empty when both were.
	Unavailable string
}

// instructionsPart measures Instructions, each way on a fresh redis-server
// of its own under callgrind.
func (c *Config) instructionsPart(ctx context.Context) (*Instructions, error) {
	fmt.Fprintln(c.Log, "instructions:")
	rep := &Instructions{Cycles: c.InstructionCycles}
	if err := callgrindOnPath(); err != nil {
		rep.Unavailable = err.Error()
		return rep, nil
	}
	args := []string{CycleCommand, "--concurrency", strconv.Itoa(c.Concurrency)}
	var err error
	if rep.Ledger, err = c.redisInstructions(ctx, "ledger", c.Cycler, args); err != nil {
		return nil, err
	}
	inRuns := slices.Concat(args, []string{"--run-steps", strconv.Itoa(RunSteps)})
	if rep.Governed, err = c.redisInstructions(ctx, "ledger-runs", c.Cycler, inRuns); err != nil {
		return nil, err
	}
	if rep.Ungoverned, err = c.redisInstructions(ctx, "ledger-run-ids", c.Cycler, slices.Concat(inRuns, []string{"--ungoverned"})); err != nil {
		return nil, err
	}
	peerBin, err := c.peerBinary(ctx)
	if err != nil {
		rep.Unavailable = "the peer: " + err.Error()
		return rep, nil
	}
	if rep.Peer, err = c.redisInstructions(ctx, "peer", peerBin, []string{"--concurrency", strconv.Itoa(c.Concurrency)}); err != nil {
		return nil, err
	}
	rep.Ratio = rep.Ledger / rep.Peer
	return rep, nil
}

// callgrindOnPath says what to install when valgrind's callgrind is missing.
func callgrindOnPath() error {
	for _, tool := range []string{"valgrind", "callgrind_control"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: install valgrind (Debian: apt-get install valgrind)", tool)
		}
	}
	return nil
}

// redisInstructions counts the instructions a fresh redis-server under
// callgrind executes per cycle of the cycler bin with args. The cycler runs
// three times: warmCycles uncounted, then warmCycles and
// warmCycles+c.InstructionCycles counted, each count dumped on its own;
// their difference per c.InstructionCycles leaves out what a run costs
// Redis beyond its cycles (connecting, loading the scripts).
func (c *Config) redisInstructions(ctx context.Context, name, bin string, args []string) (float64, error) {
	dir := filepath.Join(c.Dir, "instructions-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	out := filepath.Join(dir, "callgrind.out")
	rdb, err := c.startCallgrindRedis(dir, out)
	if err != nil {
		return 0, err
	}
	defer rdb.Stop()
	pid := strconv.Itoa(rdb.cmd.Process.Pid)
	var totals [2]int64
	for i, n := range []int64{warmCycles, warmCycles, warmCycles + c.InstructionCycles} {
		if i == 1 {
			if err := callgrindControl(ctx, "-i", "on", pid); err != nil {
				return 0, err
			}
		}
		run := slices.Concat(args, []string{"--prefix", fmt.Sprintf("%s%d", name, i), "--count", strconv.FormatInt(n, 10)})
		if _, err := c.cycler(ctx, rdb, fmt.Sprintf("%s under callgrind, %d cycles", name, n), bin, run); err != nil {
			return 0, err
		}
		if i == 0 {
			continue
		}
		if err := callgrindControl(ctx, "-d", pid); err != nil {
			return 0, err
		}
		if totals[i-1], err = callgrindTotal(fmt.Sprintf("%s.%d", out, i)); err != nil {
			return 0, err
		}
	}
	if totals[1] <= totals[0] {
		return 0, fmt.Errorf("%s: callgrind counted %d instructions for %d cycles and %d for %d more", name, totals[0], warmCycles, totals[1], c.InstructionCycles)
	}
	return float64(totals[1]-totals[0]) / float64(c.InstructionCycles), nil
}

// warmCycles is the cycles of the uncounted run, and of the shorter
// counted one.
const warmCycles = 500

// RunSteps is the steps of each run in the instructions part's governed
// cycles: an agent's task of a few dozen tool calls.
const RunSteps = 20

// startCallgrindRedis starts a fresh redis-server under callgrind, counting
// nothing until told to, with its dumps at out.N.
func (c *Config) startCallgrindRedis(dir, out string) (*Process, error) {
	wrap := []string{"valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=" + out}
	return startRedisUnder(c.placement, wrap, c.RedisServer, dir, c.redisArgs())
}

// callgrindControl runs callgrind_control with args.
func callgrindControl(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "callgrind_control", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("callgrind_control %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// callgrindTotal reads the instructions a callgrind dump counted (its
// "totals:" line).
func callgrindTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "totals:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: totals %q: %w", path, v, err)
			}
			return n, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New(path + ": no totals line")
}

func (c *Config) printInstructions(r *Instructions) {
	fmt.Fprintf(c.Out, "\ninstructions: Redis's instructions per Reserve+Complete cycle of new keys at %d concurrent calls, counted by callgrind on a fresh redis-server per way (a count of %d cycles less one of %d, after %d uncounted):\n",
		c.Concurrency, warmCycles+r.Cycles, warmCycles, warmCycles)
	if r.Ledger == 0 {
		fmt.Fprintf(c.Out, "  not measured: %s\n", r.Unavailable)
		return
	}
	fmt.Fprintf(c.Out, "  ledger in-process  %.0f\n", r.Ledger)
	fmt.Fprintf(c.Out, "      in runs of %d  %.0f (each operation a step of a governed run: %.2f × without runs)\n", RunSteps, r.Governed, r.Governed/r.Ledger)
	fmt.Fprintf(c.Out, "  with run ids only  %.0f (a run id no run governs: %.2f × without)\n", r.Ungoverned, r.Ungoverned/r.Ledger)
	if r.Peer == 0 {
		fmt.Fprintf(c.Out, "  the peer is not measured: %s\n", r.Unavailable)
		return
	}
	fmt.Fprintf(c.Out, "    peer in-process  %.0f\n  the ledger's ÷ the peer's: %.2f\n", r.Peer, r.Ratio)
}
