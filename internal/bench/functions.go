package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"
)

// Functions is what running the scripts as Redis Functions buys: new-key
// Reserves and Reserve+Complete cycles on a ledgerd that calls them by
// FCALL and on one that sends them by EVALSHA (--redis-functions=false),
// fresh stacks, the same load, rounds alternating. [0] is FCALL, [1]
// EVALSHA.
type Functions struct {
	Reserve, Cycle [2]*Summary
	// RedisRatio and LedgerdRatio are the CPU per call of FCALL ÷ that of
	// EVALSHA, ThroughputRatio calls per second likewise: medians of the
	// rounds, for Reserve ([0]) and the cycle ([1]).
	RedisRatio, LedgerdRatio, ThroughputRatio [2]float64
	// Commands counts the FCALL and EVALSHA each stack's Redis ran.
	Commands [2]map[string]int64
}

// functionWays are the two stacks of the part, by name and extra flags.
var functionWays = []struct {
	name  string
	flags []string
}{
	{"fcall", nil},
	{"evalsha", []string{"--redis-functions=false"}},
}

// functionsPart measures Functions and checks that each stack sent its
// scripts the way it was told.
func (c *Config) functionsPart(ctx context.Context) (*Functions, error) {
	fmt.Fprintln(c.Log, "functions:")
	var stacks [2]*stack
	for i, w := range functionWays {
		s, err := c.startStack("functions-"+w.name, benchPolicy, w.flags...)
		if err != nil {
			return nil, err
		}
		defer s.stop()
		stacks[i] = s
	}
	saved := c.pids
	defer func() { c.pids = saved }()
	rep := &Functions{}
	var reserves, cycles [2][]*Result
	var ratios [3][2][]float64 // redis, ledgerd, throughput; reserve, cycle
	for round := range c.Rounds {
		r := strconv.Itoa(round)
		for i, s := range stacks {
			name := functionWays[i].name
			res, err := c.windowOn(ctx, s, Spec{Name: "Reserve (new key, " + name + ")", RPCs: 1}, func(t *Target) Call { return t.ReserveNew(RunID() + "fn" + r) })
			if err != nil {
				return nil, err
			}
			reserves[i] = append(reserves[i], res)
			if res, err = c.windowOn(ctx, s, Spec{Name: "cycle (" + name + ")", RPCs: 2}, func(t *Target) Call { return t.Cycle(RunID() + "fc" + r) }); err != nil {
				return nil, err
			}
			cycles[i] = append(cycles[i], res)
		}
		for k, rs := range [][2][]*Result{reserves, cycles} {
			on, off := rs[0][round], rs[1][round]
			if off.CPU.Redis > 0 && off.CPU.Ledgerd > 0 && off.RPS() > 0 {
				ratios[0][k] = append(ratios[0][k], float64(on.CPU.Redis)/float64(off.CPU.Redis))
				ratios[1][k] = append(ratios[1][k], float64(on.CPU.Ledgerd)/float64(off.CPU.Ledgerd))
				ratios[2][k] = append(ratios[2][k], on.RPS()/off.RPS())
			}
		}
	}
	for i := range stacks {
		sums := summarize([][]*Result{reserves[i], cycles[i]})
		rep.Reserve[i], rep.Cycle[i] = sums[0], sums[1]
	}
	for k := range 2 {
		rep.RedisRatio[k], rep.LedgerdRatio[k], rep.ThroughputRatio[k] = median(ratios[0][k]), median(ratios[1][k]), median(ratios[2][k])
	}
	for i, s := range stacks {
		n, err := scriptCommands(ctx, s.rdbAddr)
		if err != nil {
			return nil, err
		}
		if want := []string{"fcall", "evalsha"}[i]; n[want] == 0 || n[[]string{"evalsha", "fcall"}[i]] != 0 {
			return nil, fmt.Errorf("functions part: the %s stack's Redis ran %v", functionWays[i].name, n)
		}
		rep.Commands[i] = n
	}
	return rep, nil
}

// windowOn runs one measured window of the call made by mk on s, at
// c.Concurrency.
func (c *Config) windowOn(ctx context.Context, s *stack, spec Spec, mk func(*Target) Call) (*Result, error) {
	t, err := Dial(s.addr, c.Conns)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	c.pids[0], c.pids[1] = s.pids()
	spec.Concurrency, spec.Warmup, spec.Duration = c.Concurrency, c.Warmup, c.Duration
	return c.run(ctx, spec, mk(t))
}

// scriptCommands returns how many FCALL and EVALSHA the Redis at addr ran
// (INFO commandstats).
func scriptCommands(ctx context.Context, addr string) (map[string]int64, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer rdb.Close()
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	n := map[string]int64{"fcall": 0, "evalsha": 0}
	for line := range strings.SplitSeq(info, "\n") {
		for cmd := range n {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
				n[cmd], _ = strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			}
		}
	}
	return n, nil
}

func (c *Config) printFunctions(f *Functions) {
	fmt.Fprintf(c.Out, "\nfunctions: new-key Reserves and Reserve+Complete cycles at %d concurrent calls on two fresh stacks, one with --redis-functions=false (%v windows; medians of %d rounds, alternating):\n",
		c.Concurrency, c.Duration, c.Rounds)
	w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "scripts by\tReserve/s\tCPU µs/Reserve: load\tledgerd\tredis\tcycles/s\tCPU µs/cycle: load\tledgerd\tredis\tscript calls\t")
	for i, way := range functionWays {
		r, y := f.Reserve[i], f.Cycle[i]
		fmt.Fprintf(w, "%s\t%.0f\t%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t%d\t\n", strings.ToUpper(way.name), r.RPS, us(r.CPU.Client), us(r.CPU.Ledgerd), us(r.CPU.Redis),
			y.RPS, us(y.CPU.Client), us(y.CPU.Ledgerd), us(y.CPU.Redis), f.Commands[i][way.name])
	}
	_ = w.Flush()
	fmt.Fprintf(c.Out, "  FCALL ÷ EVALSHA, per round: Redis CPU per Reserve %.2f, per cycle %.2f; ledgerd CPU per Reserve %.2f, per cycle %.2f; Reserves/s %.2f, cycles/s %.2f\n",
		f.RedisRatio[0], f.RedisRatio[1], f.LedgerdRatio[0], f.LedgerdRatio[1], f.ThroughputRatio[0], f.ThroughputRatio[1])
}
