package metrics

import (
	"maps"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/opledger/ledger/ledger"
)

// maxCached bounds the entries of one seriesCache. Past it, new label
// values are looked up in their vectors on every event.
const maxCached = 4096

// seriesCache maps label values to the series they name, so that an event
// finds its series with one lookup in an immutable map: no hashing and
// validating of every label value, and no lock shared by every call, as a
// vector's WithLabelValues takes. A new entry copies the map; there are at
// most maxCached of them.
type seriesCache[K comparable, V any] struct {
	mu sync.Mutex
	m  atomic.Pointer[map[K]V]
}

// get returns the series of k, made by mk on its first use.
func (c *seriesCache[K, V]) get(k K, mk func() V) V {
	if v, ok := c.load()[k]; ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.load()
	if v, ok := old[k]; ok {
		return v
	}
	if len(old) >= maxCached {
		return mk()
	}
	m := maps.Clone(old)
	if m == nil {
		m = map[K]V{}
	}
	v := mk()
	m[k] = v
	c.m.Store(&m)
	return v
}

// load returns the published map (nil before the first entry).
func (c *seriesCache[K, V]) load() map[K]V {
	if p := c.m.Load(); p != nil {
		return *p
	}
	return nil
}

// transitionKey is what an EventTransition's series depend on.
type transitionKey struct {
	tenant, tool string // raw
	from, to     ledger.State
	reason       string
}

// transitionSeries are the series one kind of transition counts in; nil
// where it counts in none.
type transitionSeries struct {
	transitions prometheus.Counter
	dwell       prometheus.Observer // leaving RUNNING or UNKNOWN
	finished    prometheus.Counter  // entering a terminal state
	attempts    prometheus.Observer // entering a terminal state
	byReason    prometheus.Counter  // RETRIES_EXHAUSTED or ESCALATED
}

// transition returns the series of transitions like e.
func (m *Metrics) transition(e ledger.Event) *transitionSeries {
	k := transitionKey{tenant: m.tenant(e.Tenant), tool: e.Tool, from: e.From, to: e.To, reason: e.Reason}
	return m.transitionCache.get(k, func() *transitionSeries {
		tool := m.tool(e.Tool)
		s := &transitionSeries{transitions: m.transitions.WithLabelValues(m.labels(e.Tenant, tool, stateLabel(e.From), stateLabel(e.To), e.Reason)...)}
		if (e.From == ledger.StateRunning || e.From == ledger.StateUnknown) && e.From != e.To {
			s.dwell = m.dwell.WithLabelValues(m.labels(e.Tenant, tool, stateLabel(e.From))...)
		}
		if e.To.Terminal() && !e.From.Terminal() {
			s.finished = m.finished.WithLabelValues(m.labels(e.Tenant, tool, stateLabel(e.To))...)
			s.attempts = m.attempts.WithLabelValues(m.labels(e.Tenant, tool, stateLabel(e.To))...)
		}
		switch e.Reason {
		case "RETRIES_EXHAUSTED":
			s.byReason = m.exhausted.WithLabelValues(m.labels(e.Tenant, tool)...)
		case "ESCALATED":
			s.byReason = m.escalations.WithLabelValues(m.labels(e.Tenant, tool)...)
		}
		return s
	})
}

// decisionKey is what an EventDecision's series depends on.
type decisionKey struct {
	tenant, tool string // raw
	decision     ledger.Decision
}

// decision returns the decisions_total series of e.
func (m *Metrics) decision(e ledger.Event) prometheus.Counter {
	k := decisionKey{tenant: m.tenant(e.Tenant), tool: e.Tool, decision: e.Decision}
	return m.decisionCache.get(k, func() prometheus.Counter {
		return m.decisions.WithLabelValues(m.labels(e.Tenant, m.tool(e.Tool), strings.ToLower(e.Decision.String()))...)
	})
}

// script returns the script_duration_seconds series of op.
func (m *Metrics) script(op string) prometheus.Observer {
	return m.scriptCache.get(op, func() prometheus.Observer { return m.scripts.WithLabelValues(op) })
}
