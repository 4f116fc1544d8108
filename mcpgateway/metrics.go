package mcpgateway

import (
	"context"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// metrics are the gateway's Prometheus metrics, in a registry of their
// own. Their labels are bounded by the configuration: the served tools'
// names, the outcomes of call.go, the upstreams' names, and with
// metrics.tenant_label the tenants of the ledger's keys.
type metrics struct {
	reg      *prometheus.Registry
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	asText   *prometheus.CounterVec
	dropped  *prometheus.CounterVec
	tenant   bool // the call metrics have a tenant label
}

// newMetrics builds g's metrics, with the Go and process collectors.
func newMetrics(g *Gateway) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), tenant: g.cfg.Metrics.TenantLabel}
	calls, duration := []string{"tool", "outcome"}, []string{"tool"}
	if m.tenant {
		calls, duration = append(calls, "tenant"), append(duration, "tenant")
	}
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ledgermcp", Name: "calls_total",
		Help: "Tool calls answered, by served tool and the outcome the answer's _meta names."}, calls)
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ledgermcp", Name: "call_duration_seconds",
		Help:    "How long a tool call took to answer, ledger and upstream included.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, duration)
	m.asText = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ledgermcp", Name: "answers_as_text_total",
		Help: "Answers given without their structured content, by served tool and reason: missing, shape (not the output schema's), too_costly (to check)."},
		[]string{"tool", "reason"})
	m.dropped = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ledgermcp", Name: "upstream_lines_dropped_total",
		Help: "Lines a command upstream wrote to stdout that are no JSON-RPC messages, dropped."}, []string{"upstream"})
	m.reg.MustRegister(m.calls, m.duration, m.asText, m.dropped, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, u := range g.upstreams {
		if u.cfg.URL == "" {
			m.dropped.WithLabelValues(u.cfg.Name) // from 0, for a command upstream
		}
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "ledgermcp", Name: "upstream_connected",
			Help: "1 while the upstream holds a session, 0 otherwise.", ConstLabels: prometheus.Labels{"upstream": u.cfg.Name}},
			func() float64 { return boolFloat(u.connected()) }))
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "ledgermcp", Name: "ledger_serving",
		Help: "1 while ledgerd's health service says SERVING (asked at most once a second), 0 otherwise."},
		func() float64 {
			return boolFloat(g.ledgerStatus(context.Background()) == healthpb.HealthCheckResponse_SERVING.String())
		}))
	return m
}

// observe counts one answered call of tool, begun at start, for tenant
// (left out without the tenant label).
func (m *metrics) observe(tool, tenant string, res *mcp.CallToolResult, start time.Time) {
	lm, _ := res.Meta[MetaLedger].(map[string]any)
	outcome, _ := lm["outcome"].(string)
	calls, duration := []string{tool, outcome}, []string{tool}
	if m.tenant {
		calls, duration = append(calls, tenant), append(duration, tenant)
	}
	m.calls.WithLabelValues(calls...).Inc()
	m.duration.WithLabelValues(duration...).Observe(time.Since(start).Seconds())
}

// MetricsHandler serves the gateway's metrics in Prometheus's text format.
func (g *Gateway) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(g.metrics.reg, promhttp.HandlerOpts{Registry: g.metrics.reg})
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
