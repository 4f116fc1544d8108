// Package metrics exposes the operation ledger's Prometheus metrics: the RPC
// metrics of go-grpc-middleware's Prometheus provider (recorded by this
// package, under the same names), and the ledger's own,
// fed by ledger.Event values (Observe) and by the live counts the
// transition scripts keep in the store (read on every scrape, cached
// briefly).
//
// Labels stay bounded: tool (at most MaxTools distinct values, the rest as
// "_other"), state, decision, reason and similar fixed sets; never operation
// ids, and tenants only when Options.TenantLabel is set.
package metrics

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/opledger/ledger/ledger"
)

// MaxTools bounds the distinct values of the tool label; further tools are
// counted as "_other".
const MaxTools = 200

// Options configure the metrics.
type Options struct {
	// TenantLabel adds a tenant label to the ledger's metrics. Off by
	// default: tenants may be many, and their names may be sensitive.
	TenantLabel bool
	// StoreCacheTTL is how long the live counts read from the store serve
	// scrapes (5s when zero).
	StoreCacheTTL time.Duration
}

// Metrics holds the registry and every metric.
type Metrics struct {
	reg     *prometheus.Registry
	rpc     *rpcMetrics
	tenants bool

	toolsMu sync.Mutex
	tools   map[string]bool

	transitionCache seriesCache[transitionKey, *transitionSeries]
	decisionCache   seriesCache[decisionKey, prometheus.Counter]
	scriptCache     seriesCache[string, prometheus.Observer]

	decisions    *prometheus.CounterVec
	transitions  *prometheus.CounterVec
	finished     *prometheus.CounterVec
	conflicts    *prometheus.CounterVec
	refusals     *prometheus.CounterVec
	attempts     *prometheus.HistogramVec
	exhausted    *prometheus.CounterVec
	dwell        *prometheus.HistogramVec
	reconciled   *prometheus.CounterVec
	escalations  *prometheus.CounterVec
	scripts      *prometheus.HistogramVec
	storeErrors  *prometheus.CounterVec
	durability   *prometheus.GaugeVec
	storeScrapes *prometheus.CounterVec
	reloaded     *prometheus.GaugeVec
	certExpiry   prometheus.Gauge
	certOnce     sync.Once
	compacted    prometheus.Counter
	passes       prometheus.Counter
	runsEnded    *prometheus.CounterVec
	runSteps     *prometheus.HistogramVec
}

// New builds the metrics in a registry of their own (with the Go and
// process collectors).
func New(o Options) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), tenants: o.TenantLabel, tools: map[string]bool{}}
	l := func(names ...string) []string {
		if m.tenants {
			return append([]string{"tenant"}, names...)
		}
		return names
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ledger", Name: name, Help: help}, labels)
		m.reg.MustRegister(c)
		return c
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ledger", Name: name, Help: help, Buckets: buckets}, labels)
		m.reg.MustRegister(h)
		return h
	}
	m.decisions = counter("decisions_total", "Reserve decisions: execute, replay, in_progress, reconcile.", l("tool", "decision")...)
	m.transitions = counter("transitions_total", "State transitions, by the state left and entered and the reason.", l("tool", "from", "to", "reason")...)
	m.finished = counter("operations_finished_total", "Operations that reached a terminal state.", l("tool", "state")...)
	m.conflicts = counter("conflicts_total", "Reserves refused as IDEMPOTENCY_KEY_REUSED, by what differed (tool, params, permit).", l("tool", "differs")...)
	m.refusals = counter("refusals_total", "Calls refused by the state machine, by reason (STALE_FENCING_TOKEN, COMPLETION_CONFLICT, ...).", l("op", "reason")...)
	m.attempts = histogram("attempts_per_operation", "Attempts an operation took, observed when it ends.", []float64{1, 2, 3, 4, 5, 8, 13, 21}, l("tool", "state")...)
	m.exhausted = counter("retries_exhausted_total", "Operations whose attempts ran out (RETRIES_EXHAUSTED).", l("tool")...)
	m.dwell = histogram("state_duration_seconds", "Time spent in RUNNING or UNKNOWN, observed when the operation leaves the state.",
		[]float64{.01, .05, .1, .5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600}, l("tool", "state")...)
	m.reconciled = counter("reconciliations_total", "Reconcile findings recorded: applied, not_applied, abandon, escalate.", l("tool", "finding")...)
	m.escalations = counter("escalations_total", "Operations escalated to human review.", l("tool")...)
	m.scripts = histogram("script_duration_seconds", "Latency of the ledger's store round trips (one script or read per call).",
		[]float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 3}, "op")
	m.storeErrors = counter("store_errors_total", "Store calls that failed (unreachable, refused, script error).", "op", "kind")
	m.durability = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ledger", Name: "store_durability_ok",
		Help: "1 when the store's setting protects acknowledged records (check: appendonly, appendfsync, maxmemory-policy), 0 when not, read at start-up and every minute."}, []string{"check"})
	m.reg.MustRegister(m.durability)
	m.storeScrapes = counter("store_scrape_errors_total", "Failed reads of the store's live counts for the unresolved gauges.", "what")
	m.reloaded = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ledger", Name: "config_last_reload_successful",
		Help: "1 when the file (credentials, tls) loaded at start-up or at the last SIGHUP, 0 when that reload failed and the previous contents stay in use."}, []string{"file"})
	m.certExpiry = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ledger", Name: "tls_certificate_expiry_timestamp_seconds",
		Help: "When the served TLS certificate expires (Unix time), as last loaded."})
	m.reg.MustRegister(m.reloaded)
	m.compacted = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ledger", Name: "records_compacted_total",
		Help: "Terminal records past their retention cut to their tombstone by the compaction pass."})
	m.passes = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "ledger", Name: "compaction_passes_total",
		Help: "Compaction passes that reached the end of a Redis master's keys (one per master and pass)."})
	m.reg.MustRegister(m.compacted, m.passes)
	m.runsEnded = counter("runs_ended_total", "Agent runs that ended, by their final state (DONE, CANCELLED, STEP_LIMIT, DEADLINE, REPETITION).", l("state")...)
	m.runSteps = histogram("run_steps", "Steps (new operations) a run took, observed when it ends.",
		[]float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}, l("state")...)
	m.rpc = newRPCMetrics()
	m.reg.MustRegister(m.rpc, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry returns the registry, for collectors of the embedding program.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// ServerOptions are the gRPC server options that record the RPC metrics.
// Given to server.New, their interceptors run before the service's own, so
// that calls refused by authentication or the rate limit, and calls that
// panicked, are counted too.
func (m *Metrics) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(m.rpc.unary),
		grpc.ChainStreamInterceptor(m.rpc.stream),
	}
}

// InitializeRPC zero-initializes the RPC metrics of every registered
// method, so dashboards see them before the first call.
func (m *Metrics) InitializeRPC(s *grpc.Server) { m.rpc.initialize(s) }

// WatchConnections exports the server's client connections, read from
// stats on every scrape: those open now (ledger_connections_open) and those
// refused for being over the limit (ledger_connections_refused_total).
func (m *Metrics) WatchConnections(stats func() (open int, refused uint64)) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "ledger", Name: "connections_open",
			Help: "Client connections open now, from their accept (before their handshakes) to their close."},
			func() float64 { open, _ := stats(); return float64(open) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ledger", Name: "connections_refused_total",
			Help: "Client connections closed as soon as they were accepted, for being over --max-connections."},
			func() float64 { _, refused := stats(); return float64(refused) }),
	)
}

// WatchHealthWatches exports the server's health Watch streams, read from
// stats on every scrape: those open now (ledger_health_watches_open) and
// those refused for being over the limit
// (ledger_health_watches_refused_total).
func (m *Metrics) WatchHealthWatches(stats func() (open int, refused uint64)) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "ledger", Name: "health_watches_open",
			Help: "grpc.health.v1.Health/Watch streams open now."},
			func() float64 { open, _ := stats(); return float64(open) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ledger", Name: "health_watches_refused_total",
			Help: "grpc.health.v1.Health/Watch calls answered RESOURCE_EXHAUSTED for being over --max-health-watches."},
			func() float64 { _, refused := stats(); return float64(refused) }),
	)
}

// SetReloaded records whether file ("credentials", "tls") loaded, at
// start-up or at a reload.
func (m *Metrics) SetReloaded(file string, ok bool) {
	v := 0.0
	if ok {
		v = 1
	}
	m.reloaded.WithLabelValues(file).Set(v)
}

// SetCertificateExpiry records when the served TLS certificate expires. The
// gauge is registered by the first call, so that a ledgerd without TLS does
// not export it.
func (m *Metrics) SetCertificateExpiry(t time.Time) {
	m.certOnce.Do(func() { m.reg.MustRegister(m.certExpiry) })
	m.certExpiry.Set(float64(t.Unix()))
}

// SetDurability records the result of a durability check.
func (m *Metrics) SetDurability(check string, ok bool) {
	v := 0.0
	if ok {
		v = 1
	}
	m.durability.WithLabelValues(check).Set(v)
}

// tool bounds the tool label.
func (m *Metrics) tool(t string) string {
	if t == "" {
		return "_unknown"
	}
	m.toolsMu.Lock()
	defer m.toolsMu.Unlock()
	if m.tools[t] {
		return t
	}
	if len(m.tools) >= MaxTools {
		return "_other"
	}
	m.tools[t] = true
	return t
}

// tenant is the tenant label's value ("" when there is no tenant label).
func (m *Metrics) tenant(t string) string {
	if m.tenants {
		return t
	}
	return ""
}

func (m *Metrics) labels(tenant string, rest ...string) []string {
	if m.tenants {
		return append([]string{tenant}, rest...)
	}
	return rest
}

var refusalReasons = map[ledger.Kind]string{
	ledger.KindStaleToken:         "STALE_FENCING_TOKEN",
	ledger.KindCompletionConflict: "COMPLETION_CONFLICT",
	ledger.KindAlreadyResolved:    "ALREADY_RESOLVED",
	ledger.KindInProgress:         "OPERATION_IN_PROGRESS",
	ledger.KindKeyExpired:         "IDEMPOTENCY_KEY_EXPIRED",
	ledger.KindQuotaExceeded:      "UNRESOLVED_LIMIT",
	ledger.KindNotCompensable:     "NOT_COMPENSABLE",
}

// runRefusals are the reasons of a step refused by a run in each final
// state.
var runRefusals = map[ledger.RunState]string{
	ledger.RunStateStepLimit:  "RUN_STEP_LIMIT",
	ledger.RunStateDeadline:   "RUN_DEADLINE",
	ledger.RunStateRepetition: "RUN_REPETITION",
	ledger.RunStateDone:       "RUN_ENDED",
	ledger.RunStateCancelled:  "RUN_ENDED",
}

var findings = map[ledger.Finding]string{
	ledger.FindingApplied: "applied", ledger.FindingNotApplied: "not_applied",
	ledger.FindingAbandon: "abandon", ledger.FindingEscalate: "escalate",
}

// Observe records a ledger event; it is the ledger's Observer.
func (m *Metrics) Observe(e ledger.Event) {
	switch e.Type {
	case ledger.EventScript:
		m.script(e.Op).Observe(e.Duration.Seconds())
		if e.Failed {
			kind := "script_error"
			if e.ErrKind == ledger.KindUnavailable {
				kind = "unavailable"
			}
			m.storeErrors.WithLabelValues(e.Op, kind).Inc()
		}
	case ledger.EventDecision:
		m.decision(e).Inc()
	case ledger.EventConflict:
		m.conflicts.WithLabelValues(m.labels(e.Tenant, m.tool(e.Tool), strings.Join(e.Differs, ","))...).Inc()
	case ledger.EventRefused:
		r, ok := refusalReasons[e.ErrKind]
		if e.ErrKind == ledger.KindRunEnded {
			r, ok = runRefusals[e.RunState]
		}
		if ok {
			m.refusals.WithLabelValues(m.labels(e.Tenant, e.Op, r)...).Inc()
		}
	case ledger.EventRunEnded:
		m.runsEnded.WithLabelValues(m.labels(e.Tenant, e.RunState.String())...).Inc()
		m.runSteps.WithLabelValues(m.labels(e.Tenant, e.RunState.String())...).Observe(float64(e.Count))
	case ledger.EventCompacted:
		m.compacted.Add(float64(e.Count))
	case ledger.EventCompactionPass:
		m.passes.Inc()
	case ledger.EventReconciled:
		m.reconciled.WithLabelValues(m.labels(e.Tenant, m.tool(e.Tool), findings[e.Finding])...).Inc()
	case ledger.EventTransition:
		s := m.transition(e)
		s.transitions.Inc()
		if s.dwell != nil {
			s.dwell.Observe(e.Dwell.Seconds())
		}
		if s.finished != nil {
			s.finished.Inc()
			s.attempts.Observe(float64(e.Attempt))
		}
		if s.byReason != nil {
			s.byReason.Inc()
		}
	}
}

func stateLabel(s ledger.State) string {
	if s == ledger.StateUnspecified {
		return "NONE"
	}
	return s.String()
}

// WatchStore makes every scrape read the unresolved gauges from l (the live
// counts the transition scripts keep), at most once per cache period.
func (m *Metrics) WatchStore(l *ledger.Ledger, ttl time.Duration) {
	if ttl <= 0 {
		ttl = 5 * time.Second
	}
	m.reg.MustRegister(&storeCollector{m: m, l: l, ttl: ttl,
		unresolved: prometheus.NewDesc("ledger_unresolved_operations",
			"Non-terminal operations (PENDING, RUNNING, UNKNOWN) in the store, read from the live counts.",
			m.labels("tenant", "tool", "state"), nil),
		overdue: prometheus.NewDesc("ledger_unresolved_overdue",
			"Operations nothing moved within their recovery window (UNKNOWN, PENDING, or an idempotent claim past its lease), by effect and state: the alert.",
			m.labels("tenant", "tool", "effect", "state"), nil),
		negative: prometheus.NewDesc("ledger_live_counts_negative",
			"The live counts below zero behind ledger_unresolved_operations, summed over the shards: 0 unless the counts drifted from the records.",
			m.labels("tenant", "tool", "state"), nil),
	})
}

// storeCollector reads the live counts on scrape.
type storeCollector struct {
	m                   *Metrics
	l                   *ledger.Ledger
	ttl                 time.Duration
	unresolved, overdue *prometheus.Desc
	negative            *prometheus.Desc

	mu      sync.Mutex
	at      time.Time
	live    []ledger.LiveCount
	late    []ledger.OverdueCount
	haveAny bool
	// seen are the label sets reported before: they read 0 once their
	// operations are gone, instead of vanishing.
	seenUnresolved map[[3]string]bool
	seenOverdue    map[[4]string]bool
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.unresolved
	ch <- c.overdue
	ch <- c.negative
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.haveAny || time.Since(c.at) >= c.ttl {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		live, err1 := c.l.LiveCounts(ctx)
		late, err2 := c.l.Overdue(ctx)
		cancel()
		if err1 != nil {
			c.m.storeScrapes.WithLabelValues("live_counts").Inc()
		}
		if err2 != nil {
			c.m.storeScrapes.WithLabelValues("overdue").Inc()
		}
		if err1 == nil && err2 == nil {
			c.live, c.late, c.at, c.haveAny = live, late, time.Now(), true
		}
	}
	if c.seenUnresolved == nil {
		c.seenUnresolved, c.seenOverdue = map[[3]string]bool{}, map[[4]string]bool{}
	}
	// A label set of ledger_unresolved_operations has one of
	// ledger_live_counts_negative too (0 unless its counts drifted).
	unresolved, negative := map[[3]string]float64{}, map[[3]string]float64{}
	for k := range c.seenUnresolved {
		unresolved[k], negative[k] = 0, 0
	}
	for _, lc := range c.live {
		k := [3]string{c.m.tenant(lc.Tenant), c.m.tool(lc.Tool), lc.State.String()}
		unresolved[k] += float64(lc.N)
		negative[k] += float64(lc.Negative)
	}
	for k, n := range unresolved {
		c.seenUnresolved[k] = true
		ch <- prometheus.MustNewConstMetric(c.unresolved, prometheus.GaugeValue, n, c.m.labels(k[0], k[1], k[2])...)
		ch <- prometheus.MustNewConstMetric(c.negative, prometheus.GaugeValue, negative[k], c.m.labels(k[0], k[1], k[2])...)
	}
	overdue := map[[4]string]float64{}
	for k := range c.seenOverdue {
		overdue[k] = 0
	}
	for _, oc := range c.late {
		overdue[[4]string{c.m.tenant(oc.Tenant), c.m.tool(oc.Tool), oc.Effect.String(), oc.State.String()}] += float64(oc.N)
	}
	for k, n := range overdue {
		c.seenOverdue[k] = true
		ch <- prometheus.MustNewConstMetric(c.overdue, prometheus.GaugeValue, n, c.m.labels(k[0], k[1], k[2], k[3])...)
	}
}
