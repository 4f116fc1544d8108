package bench

import (
	"slices"
	"time"
)

// Summary is one scenario over the rounds of a benchmark: the median of each
// measure, and the median of each ratio to health Check measured in the same
// round (ratios within a round hold on a noisy machine; absolute numbers
// drift between rounds).
type Summary struct {
	Name        string
	Concurrency int
	RPCs        int   // RPCs per call
	Rounds      int   // how many rounds it ran
	Calls       int64 // over all rounds
	RPS         float64
	P50, P99    time.Duration
	CPU         CPU
	// RatioRPS is RPCs per second over health Check's calls per second;
	// RatioP50 and RatioP99 are this scenario's latency over health Check's.
	RatioRPS, RatioP50, RatioP99 float64
}

// summarize turns results[scenario][round] into summaries; results[0] is
// health Check.
func summarize(results [][]*Result) []*Summary {
	if len(results) == 0 {
		return nil
	}
	base := results[0]
	out := make([]*Summary, 0, len(results))
	for _, rounds := range results {
		s := &Summary{Name: rounds[0].Name, Concurrency: rounds[0].Concurrency, RPCs: rounds[0].RPCs, Rounds: len(rounds)}
		var rps, rr, r50, r99 []float64
		var p50, p99, client, ledgerd, redis, gateway []time.Duration
		for i, r := range rounds {
			s.Calls += r.Calls
			rps = append(rps, r.RPS())
			p50 = append(p50, r.Quantile(0.5))
			p99 = append(p99, r.Quantile(0.99))
			client = append(client, r.CPU.Client)
			ledgerd = append(ledgerd, r.CPU.Ledgerd)
			redis = append(redis, r.CPU.Redis)
			gateway = append(gateway, r.CPU.Gateway)
			if i < len(base) && base[i].RPS() > 0 {
				rr = append(rr, r.RPS()*float64(r.RPCs)/base[i].RPS())
				r50 = append(r50, float64(r.Quantile(0.5))/float64(base[i].Quantile(0.5)))
				r99 = append(r99, float64(r.Quantile(0.99))/float64(base[i].Quantile(0.99)))
			}
		}
		s.RPS, s.P50, s.P99 = median(rps), median(p50), median(p99)
		s.CPU = CPU{Client: median(client), Ledgerd: median(ledgerd), Redis: median(redis), Gateway: median(gateway)}
		s.RatioRPS, s.RatioP50, s.RatioP99 = median(rr), median(r50), median(r99)
		out = append(out, s)
	}
	return out
}

func median[T float64 | time.Duration](v []T) T {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
