package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"text/tabwriter"
)

// Pair compares two ledgerd binaries, Config.Ledgerd ([0]) and
// Config.Against ([1]): each on a fresh redis-server of its own, both
// driven at once by the same load, so that whatever else the machine runs
// meanwhile falls on both alike. What one measures against the other is
// the CPU per call of its ledgerd and of its Redis (where a binary's
// scripts show).
type Pair struct {
	// Binaries are the two ledgerd binaries.
	Binaries [2]string
	// Reserve and Cycle are each binary's new-key Reserves and
	// Reserve+Complete cycles; CPU.Client is not measured (one load
	// generator drives both).
	Reserve, Cycle [2]*Summary
	// LedgerdRatio, RedisRatio and ThroughputRatio are Against's ledgerd
	// CPU per call, its Redis's, and its calls per second, ÷ Ledgerd's:
	// medians of the rounds, for Reserve ([0]) and the cycle ([1]).
	LedgerdRatio, RedisRatio, ThroughputRatio [2]float64
}

// pairPart measures Pair.
func (c *Config) pairPart(ctx context.Context) (*Pair, error) {
	fmt.Fprintln(c.Log, "pair:")
	rep := &Pair{Binaries: [2]string{c.Ledgerd, c.Against}}
	var stacks [2]*stack
	for i, bin := range rep.Binaries {
		s, err := c.startStackOf(bin, "pair-"+strconv.Itoa(i), benchPolicy)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.pairName(i), err)
		}
		defer s.stop()
		stacks[i] = s
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
	var ratios [3][2][]float64  // ledgerd, redis, throughput; kind
	for round := range c.Rounds {
		for k, kind := range kinds {
			prefix := RunID() + "p" + strconv.Itoa(k) + "r" + strconv.Itoa(round)
			mk := func(t *Target) Call { return kind.call(t, prefix) }
			res, err := c.pairWindow(ctx, stacks, [2]string{c.pairName(0), c.pairName(1)}, Spec{Name: kind.name, RPCs: kind.rpcs}, [2]func(*Target) Call{mk, mk})
			if err != nil {
				return nil, err
			}
			for i := range res {
				results[k][i] = append(results[k][i], res[i])
			}
			if a, b := res[0], res[1]; a.CPU.Ledgerd > 0 && a.CPU.Redis > 0 && a.RPS() > 0 {
				ratios[0][k] = append(ratios[0][k], float64(b.CPU.Ledgerd)/float64(a.CPU.Ledgerd))
				ratios[1][k] = append(ratios[1][k], float64(b.CPU.Redis)/float64(a.CPU.Redis))
				ratios[2][k] = append(ratios[2][k], b.RPS()/a.RPS())
			}
		}
	}
	for i := range 2 {
		sums := summarize([][]*Result{results[0][i], results[1][i]})
		rep.Reserve[i], rep.Cycle[i] = sums[0], sums[1]
	}
	for k := range kinds {
		rep.LedgerdRatio[k], rep.RedisRatio[k], rep.ThroughputRatio[k] = median(ratios[0][k]), median(ratios[1][k]), median(ratios[2][k])
	}
	return rep, nil
}

// pairWindow runs one measured window of spec on both stacks at once,
// each with c.Concurrency calls of its own made by its mk, and counts each
// stack's server and Redis CPU in its result (as Ledgerd and Redis); names
// name the stacks in errors.
func (c *Config) pairWindow(ctx context.Context, stacks [2]*stack, names [2]string, spec Spec, mk [2]func(t *Target) Call) ([2]*Result, error) {
	fmt.Fprintf(c.Log, "  %s on both at concurrency %d ...\n", spec.Name, c.Concurrency)
	spec.Concurrency, spec.Warmup, spec.Duration = c.Concurrency, c.Warmup, c.Duration
	var res [2]*Result
	var errs [2]error
	var wg sync.WaitGroup
	for i, s := range stacks {
		t, err := Dial(s.addr, c.Conns)
		if err != nil {
			return res, err
		}
		defer t.Close()
		wg.Go(func() {
			m := &cpuMeter{}
			m.ledgerd, m.redis = s.pids()
			sp := spec
			sp.Window = m.window
			res[i] = Drive(ctx, sp, mk[i](t))
			res[i].CPU = m.perCall(res[i].Calls)
			res[i].CPU.Client = 0
			if res[i].Errors > 0 {
				errs[i] = fmt.Errorf("%s on %s: %d of %d calls failed; the first: %v", spec.Name, names[i], res[i].Errors, res[i].Errors+res[i].Calls, res[i].FirstErr)
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
	fmt.Fprintf(c.Out, "\npair: new-key Reserves and Reserve+Complete cycles at %d concurrent calls on each of two ledgerd binaries at once, each on a fresh redis-server of its own (%v windows; medians of %d rounds):\n",
		c.Concurrency, c.Duration, c.Rounds)
	w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "ledgerd\tReserve/s\tCPU µs/Reserve: ledgerd\tredis\tcycles/s\tCPU µs/cycle: ledgerd\tredis\t")
	for i := range p.Binaries {
		r, y := p.Reserve[i], p.Cycle[i]
		fmt.Fprintf(w, "%s\t%.0f\t%s\t%s\t%.0f\t%s\t%s\t\n", c.pairName(i), r.RPS, us(r.CPU.Ledgerd), us(r.CPU.Redis), y.RPS, us(y.CPU.Ledgerd), us(y.CPU.Redis))
	}
	_ = w.Flush()
	fmt.Fprintf(c.Out, "  per round, --against ÷ --ledgerd: ledgerd CPU per Reserve %.2f, per cycle %.2f; Redis CPU per Reserve %.2f, per cycle %.2f; Reserves/s %.2f, cycles/s %.2f\n",
		p.LedgerdRatio[0], p.LedgerdRatio[1], p.RedisRatio[0], p.RedisRatio[1], p.ThroughputRatio[0], p.ThroughputRatio[1])
}
