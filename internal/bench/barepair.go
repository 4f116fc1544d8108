package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"text/tabwriter"
)

// BarePair sets ledgerd's new-key Reserves beside the bare server's calls
// (health Check with one EVALSHA), driven at once, each server on a fresh
// redis-server of its own: the ratio of their CPU per call taken in the
// same windows, so that whatever else the machine runs falls on both
// alike. The throughput part takes the same ratio from windows one after
// the other.
type BarePair struct {
	// Reserve is ledgerd's new-key Reserves, Bare the bare server's calls
	// (its CPU in CPU.Ledgerd); CPU.Client is not measured.
	Reserve, Bare *Summary
	// Ratio is ledgerd's CPU per Reserve ÷ the bare server's per call: the
	// median of the rounds' ratios.
	Ratio float64
}

// BarePairKey is the part's --only key.
const BarePairKey = "bare-pair"

// barePairPart measures BarePair.
func (c *Config) barePairPart(ctx context.Context) (*BarePair, error) {
	fmt.Fprintln(c.Log, "bare pair:")
	ledgerd, err := c.startStackOf(c.Ledgerd, "bare-pair-ledgerd", benchPolicy)
	if err != nil {
		return nil, err
	}
	defer ledgerd.stop()
	bare, err := c.startBareStack("bare-pair-bare")
	if err != nil {
		return nil, err
	}
	defer bare.stop()
	names := [2]string{"ledgerd", "the bare server"}
	var results [2][]*Result
	var ratios []float64
	for round := range c.Rounds {
		prefix := RunID() + "b" + strconv.Itoa(round)
		res, err := c.pairWindow(ctx, [2]*stack{ledgerd, bare}, names, Spec{Name: reserveName + " and " + BareName, RPCs: 1},
			[2]func(*Target) Call{func(t *Target) Call { return t.ReserveNew(prefix) }, (*Target).Health})
		if err != nil {
			return nil, err
		}
		for i := range res {
			results[i] = append(results[i], res[i])
		}
		if res[1].CPU.Ledgerd > 0 {
			ratios = append(ratios, float64(res[0].CPU.Ledgerd)/float64(res[1].CPU.Ledgerd))
		}
	}
	sums := summarize(results[:])
	return &BarePair{Reserve: sums[0], Bare: sums[1], Ratio: median(ratios)}, nil
}

// startBareStack starts a fresh redis-server and the bare server on it,
// with their files under c.Dir/name.
func (c *Config) startBareStack(name string) (*stack, error) {
	r, dir, err := c.startRedisIn(name)
	if err != nil {
		return nil, err
	}
	b, err := c.startBareLogged(filepath.Join(dir, "bare.log"), "--redis-addr", r.Addr)
	if err != nil {
		r.Stop()
		return nil, err
	}
	return &stack{redis: r, ledgerd: b, addr: b.Addr, rdbAddr: r.Addr}, nil
}

func (c *Config) printBarePair(p *BarePair) {
	fmt.Fprintf(c.Out, "\nbare pair: ledgerd's new-key Reserves and the bare server's calls (%s) at %d concurrent calls each, at once, each on a fresh redis-server of its own (%v windows; medians of %d rounds):\n",
		BareName, c.Concurrency, c.Duration, c.Rounds)
	w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "server\tcalls/s\tCPU µs/call: server\tredis\t")
	fmt.Fprintf(w, "ledgerd (Reserve)\t%.0f\t%s\t%s\t\n", p.Reserve.RPS, us(p.Reserve.CPU.Ledgerd), us(p.Reserve.CPU.Redis))
	fmt.Fprintf(w, "bare server\t%.0f\t%s\t%s\t\n", p.Bare.RPS, us(p.Bare.CPU.Ledgerd), us(p.Bare.CPU.Redis))
	_ = w.Flush()
	fmt.Fprintf(c.Out, "  per round, ledgerd CPU per Reserve ÷ the bare server's per call: %.2f\n", p.Ratio)
}
