package metrics

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/opledger/ledger/ledger"
)

func TestSeriesCache(t *testing.T) {
	for _, c := range []struct {
		name      string
		keys      []int
		wantMade  int
		wantSame  bool // the last two gets answered the same series
		wantCache int
	}{
		{"a key made once", []int{1, 1, 1}, 1, true, 1},
		{"two keys", []int{1, 2}, 2, false, 2},
		{"past maxCached, made each time", append(seq(maxCached), -1, -1), maxCached + 2, false, maxCached},
		{"past maxCached, the cached still found", append(seq(maxCached), -1, 0), maxCached + 1, false, maxCached},
	} {
		t.Run(c.name, func(t *testing.T) {
			var sc seriesCache[int, *int]
			made := 0
			var got []*int
			for _, k := range c.keys {
				got = append(got, sc.get(k, func() *int { made++; v := k; return &v }))
			}
			if made != c.wantMade {
				t.Errorf("made %d series, want %d", made, c.wantMade)
			}
			last, prev := got[len(got)-1], got[len(got)-2]
			if (last == prev) != c.wantSame {
				t.Errorf("last two gets the same series: %v, want %v", last == prev, c.wantSame)
			}
			if n := len(sc.load()); n != c.wantCache {
				t.Errorf("%d cached, want %d", n, c.wantCache)
			}
			for i, k := range c.keys {
				if *got[i] != k {
					t.Errorf("get(%d) answered the series of %d", k, *got[i])
				}
			}
		})
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestObserveCachedSeries observes events several times each, so that all
// but the first find their series in the caches, and reads the counts back
// from the registry: every event counts once, in the series its labels
// name, also for tools past MaxTools (as "_other").
func TestObserveCachedSeries(t *testing.T) {
	m := New(Options{})
	const n = 3
	var tools []string
	for i := range MaxTools + 2 {
		tools = append(tools, "tool-"+strconv.Itoa(i))
	}
	for range n {
		for _, tool := range tools {
			m.Observe(ledger.Event{Type: ledger.EventDecision, Tool: tool, Decision: ledger.DecisionExecute})
			m.Observe(ledger.Event{Type: ledger.EventTransition, Tool: tool, From: ledger.StateUnspecified, To: ledger.StateRunning, Reason: "RESERVED"})
			m.Observe(ledger.Event{Type: ledger.EventTransition, Tool: tool, From: ledger.StateRunning, To: ledger.StateFailedFinal,
				Reason: "RETRIES_EXHAUSTED", Attempt: 2, Dwell: time.Second})
		}
		m.Observe(ledger.Event{Type: ledger.EventScript, Op: "Reserve", Duration: time.Millisecond})
		m.Observe(ledger.Event{Type: ledger.EventDecision, Tool: "tool-0", Decision: ledger.DecisionReplay})
	}
	for _, c := range []struct {
		family string
		labels map[string]string
		want   float64
	}{
		{"ledger_decisions_total", map[string]string{"tool": "tool-0", "decision": "execute"}, n},
		{"ledger_decisions_total", map[string]string{"tool": "tool-0", "decision": "replay"}, n},
		{"ledger_decisions_total", map[string]string{"tool": "_other", "decision": "execute"}, 2 * n},
		{"ledger_transitions_total", map[string]string{"tool": "tool-7", "from": "NONE", "to": "RUNNING", "reason": "RESERVED"}, n},
		{"ledger_transitions_total", map[string]string{"tool": "_other", "from": "RUNNING", "to": "FAILED_FINAL", "reason": "RETRIES_EXHAUSTED"}, 2 * n},
		{"ledger_operations_finished_total", map[string]string{"tool": "tool-7", "state": "FAILED_FINAL"}, n},
		{"ledger_attempts_per_operation", map[string]string{"tool": "tool-7", "state": "FAILED_FINAL"}, n},
		{"ledger_state_duration_seconds", map[string]string{"tool": "tool-7", "state": "RUNNING"}, n},
		{"ledger_retries_exhausted_total", map[string]string{"tool": "_other"}, 2 * n},
		{"ledger_script_duration_seconds", map[string]string{"op": "Reserve"}, n},
	} {
		if got := seriesValue(t, m.reg, c.family, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.family, c.labels, got, c.want)
		}
	}
}

// seriesValue is the value of a counter, or the sample count of a
// histogram, of the first series with every label of labels; -1 when there
// is none.
func seriesValue(t *testing.T, reg *prometheus.Registry, family string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != family {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			l := labelMap(m)
			for k, v := range labels {
				if l[k] != v {
					continue metrics
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// BenchmarkObserveReserve: what recording a new-key Reserve's ledger
// metrics costs (its script, its transition and its decision).
//
//	go test -run '^$' -bench ObserveReserve -benchmem ./metrics
func BenchmarkObserveReserve(b *testing.B) {
	m := New(Options{})
	events := []ledger.Event{
		{Type: ledger.EventScript, Op: "Reserve", Duration: time.Millisecond},
		{Type: ledger.EventTransition, Op: "Reserve", Tenant: "default", Tool: "payments.refund", From: ledger.StateUnspecified, To: ledger.StateRunning, Reason: "RESERVED"},
		{Type: ledger.EventDecision, Op: "Reserve", Tenant: "default", Tool: "payments.refund", Decision: ledger.DecisionExecute},
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, e := range events {
			m.Observe(e)
		}
	}
}
