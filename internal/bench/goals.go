package bench

import (
	"fmt"
	"text/tabwriter"
	"time"
)

// Goal is one performance goal (docs/benchmarks.md, "The goals in the
// report") as this run measured it.
type Goal struct {
	Name   string
	Got    float64
	Limit  float64
	AtMost bool   // met when Got <= Limit; else when Got >= Limit
	Unit   string // "µs", "×" or "B"
}

// Met reports whether the run met the goal.
func (g Goal) Met() bool {
	if g.AtMost {
		return g.Got <= g.Limit
	}
	return g.Got >= g.Limit
}

// goals returns the goals rep holds the measurements of, in a fixed order.
func goals(rep *Report) []Goal {
	byName := map[string]*Summary{}
	for _, s := range rep.Throughput {
		byName[s.Name] = s
	}
	var out []Goal
	reserve, cycle, bare := byName[reserveName], byName[cycleName], byName[BareName]
	if reserve != nil && reserve.CPU.Redis > 0 {
		out = append(out, Goal{"Redis CPU per new-key Reserve", micros(reserve.CPU.Redis), 20, true, "µs"})
	}
	if cycle != nil && cycle.CPU.Redis > 0 {
		out = append(out, Goal{"Redis CPU per Reserve+Complete cycle", micros(cycle.CPU.Redis), 45, true, "µs"})
	}
	if reserve != nil && bare != nil && bare.CPU.Ledgerd > 0 {
		out = append(out, Goal{"ledgerd CPU per new-key Reserve ÷ the bare server's per call",
			float64(reserve.CPU.Ledgerd) / float64(bare.CPU.Ledgerd), 1.8, true, "×"})
	}
	if p := rep.BarePair; p != nil && p.Ratio > 0 {
		out = append(out, Goal{"ledgerd CPU per new-key Reserve ÷ the bare server's, at once", p.Ratio, 1.8, true, "×"})
	}
	if reserve != nil && reserve.RatioRPS > 0 {
		out = append(out, Goal{"Reserve throughput ÷ health Check", reserve.RatioRPS, 0.40, false, "×"})
	}
	if p := rep.Peer; p != nil && p.Unavailable == "" && p.RedisRatio > 0 {
		out = append(out,
			Goal{"ledger in-process cycles/s ÷ the peer's", p.InprocRatio, 1.3, false, "×"},
			Goal{"ledger over gRPC cycles/s ÷ the peer's in-process", p.GRPCRatio, 0.5, false, "×"},
			Goal{"Redis CPU per cycle, the ledger's ÷ the peer's", p.RedisRatio, 0.6, true, "×"})
	}
	if in := rep.Instructions; in != nil && in.Ratio > 0 {
		out = append(out, Goal{"Redis instructions per cycle, the ledger's ÷ the peer's (callgrind)", in.Ratio, 0.6, true, "×"})
	}
	if rep.Memory != nil && rep.Memory.Records > 0 {
		out = append(out, Goal{"bytes per SUCCEEDED record (100-byte result)", rep.Memory.PerRecord, 380, true, "B"})
	}
	return out
}

// printGoals prints the goals the run measured, met or not.
func (c *Config) printGoals(rep *Report) {
	gs := goals(rep)
	if len(gs) == 0 {
		return
	}
	fmt.Fprintln(c.Out, "\ngoals (docs/benchmarks.md), as this run measured them:")
	w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', 0)
	for _, g := range gs {
		op, verdict := "≥", "not met"
		if g.AtMost {
			op = "≤"
		}
		if g.Met() {
			verdict = "met"
		}
		fmt.Fprintf(w, "  %s\t%s %s\t(goal %s %s %s)\t%s\n", g.Name, num(g.Got), g.Unit, op, num(g.Limit), g.Unit, verdict)
	}
	_ = w.Flush()
}

// micros is d in µs.
func micros(d time.Duration) float64 { return float64(d) / 1e3 }

// num prints a measure with two decimals below 10, else none.
func num(v float64) string {
	if v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.0f", v)
}
