package mcpgateway

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// HealthPath is where the Streamable HTTP listener answers health probes.
const HealthPath = "/healthz"

// The ledger's health is asked at most once per healthAge, and waited for
// at most healthTimeout.
const (
	healthAge     = time.Second
	healthTimeout = 2 * time.Second
)

// Health is a health probe's answer. It names no upstream, tool or tenant:
// the probe needs no credentials.
type Health struct {
	// Status is SERVING when the ledger serves and at least one upstream
	// holds a session, NOT_SERVING otherwise.
	Status string `json:"status"`
	// Ledger is ledgerd's grpc.health.v1 status, or UNREACHABLE.
	Ledger string `json:"ledger"`
	// Upstreams counts the configured upstreams, Connected those holding a
	// session now.
	Upstreams int `json:"upstreams"`
	Connected int `json:"upstreams_connected"`
}

// ledgerHealth remembers the ledger's last answer for healthAge.
type ledgerHealth struct {
	mu     sync.Mutex // held while asking: one question at a time
	status string
	at     time.Time
}

// Health reports whether the gateway can serve calls: the ledger's status
// and how many upstreams hold a session.
func (g *Gateway) Health(ctx context.Context) Health {
	h := Health{Ledger: g.ledgerStatus(ctx), Upstreams: len(g.upstreams), Status: "NOT_SERVING"}
	for _, u := range g.upstreams {
		if u.connected() {
			h.Connected++
		}
	}
	if h.Ledger == healthpb.HealthCheckResponse_SERVING.String() && h.Connected > 0 {
		h.Status = "SERVING"
	}
	return h
}

// ledgerStatus asks ledgerd's health service, or answers from the last
// question when it is younger than healthAge.
func (g *Gateway) ledgerStatus(ctx context.Context) string {
	l := &g.health
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.status != "" && time.Since(l.at) < healthAge {
		return l.status
	}
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	res, err := healthpb.NewHealthClient(g.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	l.status, l.at = "UNREACHABLE", time.Now()
	if err == nil {
		l.status = res.GetStatus().String()
	}
	return l.status
}

// serveHealth answers a probe: 200 with Health when it is SERVING, 503
// with it otherwise; 405 to methods other than GET and HEAD.
func (g *Gateway) serveHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the health probe takes GET or HEAD", http.StatusMethodNotAllowed)
		return
	}
	h := g.Health(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if h.Status != "SERVING" {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(h)
}
