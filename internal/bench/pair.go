package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"text/tabwriter"
)

// Pair compares two ledgerd binaries, Config.Ledgerd ([0]) and
// Config.Against ([1]): both on one fresh redis-server, both driven at once
// by the same load, so that whatever else the machine runs meanwhile falls
// on both alike. What one measures against the other is its CPU per call.
type Pair struct {
	// Binaries are the two ledgerd binaries.
	Binaries [2]string
	// Reserve and Cycle are each binary's new-key Reserves and
	// Reserve+Complete cycles; CPU.Client and CPU.Redis are not measured
	// (the load generator and Redis serve both).
	Reserve, Cycle [2]*Summary
	// LedgerdRatio and ThroughputRatio are Against's CPU per call, and
	// calls per second, ÷ Ledgerd's: medians of the rounds, for Reserve
	// ([0]) and the cycle ([1]).
	LedgerdRatio, ThroughputRatio [2]float64
}

// pairPart measures Pair.
func (c *Config) pairPart(ctx context.Context) (*Pair, error) {
	fmt.Fprintln(c.Log, "pair:")
	dir := filepath.Join(c.Dir, "pair")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	r, err := startRedisOn(c.placement, c.RedisServer, dir, c.redisArgs())
	if err != nil {
		return nil, err
	}
	defer r.Stop()
	flags, err := c.ledgerdFlags(dir, benchPolicy, nil)
	if err != nil {
		return nil, err
	}
	rep := &Pair{Binaries: [2]string{c.Ledgerd, c.Against}}
	var servers [2]*Process
	for i, bin := range rep.Binaries {
		l, err := startLedgerdOn(c.placement, bin, r.Addr, filepath.Join(dir, "ledgerd-"+strconv.Itoa(i)+".log"), flags)
		if err != nil {
			return nil, err
		}
		defer l.Stop()
		servers[i] = l
	}
	kinds := []struct {
		name string
		rpcs int
		call func(*Target, string) Call
	}{
		{"Reserve (new key)", 1, (*Target).ReserveNew},
		{"Reserve+Complete cycle", 2, (*Target).Cycle},
	}
	var results [2][2][]*Result // kind, binary, round
	var ratios [2][2][]float64  // CPU, throughput; kind
	for round := range c.Rounds {
		for k, kind := range kinds {
			prefix := RunID() + "p" + strconv.Itoa(k) + "r" + strconv.Itoa(round)
			res, err := c.pairWindow(ctx, servers, Spec{Name: kind.name, RPCs: kind.rpcs}, func(t *Target, i int) Call {
				return kind.call(t, prefix+"b"+strconv.Itoa(i))
			})
			if err != nil {
				return nil, err
			}
			for i := range res {
				results[k][i] = append(results[k][i], res[i])
			}
			if res[0].CPU.Ledgerd > 0 && res[0].RPS() > 0 {
				ratios[0][k] = append(ratios[0][k], float64(res[1].CPU.Ledgerd)/float64(res[0].CPU.Ledgerd))
				ratios[1][k] = append(ratios[1][k], res[1].RPS()/res[0].RPS())
			}
		}
	}
	for i := range 2 {
		sums := summarize([][]*Result{results[0][i], results[1][i]})
		rep.Reserve[i], rep.Cycle[i] = sums[0], sums[1]
	}
	for k := range kinds {
		rep.LedgerdRatio[k], rep.ThroughputRatio[k] = median(ratios[0][k]), median(ratios[1][k])
	}
	return rep, nil
}

// pairWindow runs one measured window of spec on both servers at once,
// each with c.Concurrency calls of its own made by mk, and counts each
// server's CPU in its result's ledgerd column.
func (c *Config) pairWindow(ctx context.Context, servers [2]*Process, spec Spec, mk func(t *Target, i int) Call) ([2]*Result, error) {
	fmt.Fprintf(c.Log, "  %s on both at concurrency %d ...\n", spec.Name, c.Concurrency)
	spec.Concurrency, spec.Warmup, spec.Duration = c.Concurrency, c.Warmup, c.Duration
	var res [2]*Result
	var errs [2]error
	var wg sync.WaitGroup
	for i, s := range servers {
		t, err := Dial(s.Addr, c.Conns)
		if err != nil {
			return res, err
		}
		defer t.Close()
		wg.Go(func() {
			m := &cpuMeter{ledgerd: s.cmd.Process.Pid}
			sp := spec
			sp.Window = m.window
			res[i] = Drive(ctx, sp, mk(t, i))
			res[i].CPU = CPU{Ledgerd: m.perCall(res[i].Calls).Ledgerd}
			if res[i].Errors > 0 {
				errs[i] = fmt.Errorf("%s on %s: %d of %d calls failed; the first: %v", spec.Name, c.pairName(i), res[i].Errors, res[i].Errors+res[i].Calls, res[i].FirstErr)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs[0], errs[1], ctx.Err()); err != nil {
		return res, err
	}
	return res, nil
}

// pairName is how the report names binary i of the pair.
func (c *Config) pairName(i int) string {
	return []string{"--ledgerd ", "--against "}[i] + []string{c.Ledgerd, c.Against}[i]
}

func (c *Config) printPair(p *Pair) {
	fmt.Fprintf(c.Out, "\npair: new-key Reserves and Reserve+Complete cycles at %d concurrent calls on each of two ledgerd binaries at once, one fresh redis-server (%v windows; medians of %d rounds):\n",
		c.Concurrency, c.Duration, c.Rounds)
	w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "ledgerd\tReserve/s\tledgerd CPU µs/Reserve\tcycles/s\tledgerd CPU µs/cycle\t")
	for i := range p.Binaries {
		r, y := p.Reserve[i], p.Cycle[i]
		fmt.Fprintf(w, "%s\t%.0f\t%s\t%.0f\t%s\t\n", c.pairName(i), r.RPS, us(r.CPU.Ledgerd), y.RPS, us(y.CPU.Ledgerd))
	}
	_ = w.Flush()
	fmt.Fprintf(c.Out, "  per round, --against ÷ --ledgerd: ledgerd CPU per Reserve %.2f, per cycle %.2f; Reserves/s %.2f, cycles/s %.2f\n",
		p.LedgerdRatio[0], p.LedgerdRatio[1], p.ThroughputRatio[0], p.ThroughputRatio[1])
}
