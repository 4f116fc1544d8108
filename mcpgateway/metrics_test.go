package mcpgateway_test

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/mcpgateway"
)

// scrape returns the gateway's metrics in Prometheus's text format.
func scrape(t *testing.T, g *mcpgateway.Gateway) string {
	t.Helper()
	w := httptest.NewRecorder()
	g.MetricsHandler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(w.Result().Body)
	return string(b)
}

// TestMetrics: every answered call is counted by tool and the outcome its
// answer names (as many executed as the upstream applied), and the gauges
// follow the upstreams and the ledger.
func TestMetrics(t *testing.T) {
	r := newRig(t, rigOptions{upstreams: "  - name: broken\n    command: [/nonexistent/mcp-server]"})
	cs := r.http("", clientOptions{})
	args := map[string]any{"title": "Printer on fire"}
	for _, tc := range []struct {
		meta mcp.Meta
		want string
	}{
		{mcp.Meta{mcpgateway.MetaIdempotencyKey: "metrics-1"}, "executed"},
		{mcp.Meta{mcpgateway.MetaIdempotencyKey: "metrics-1"}, "replayed"},
		{mcp.Meta{mcpgateway.MetaIdempotencyKey: 7}, "invalid_request"},
		{mcp.Meta{mcpgateway.MetaIdempotencyKey: "metrics-2"}, "executed"},
	} {
		if a := call(t, cs, "tickets_create_ticket", args, tc.meta); a.outcome() != tc.want {
			t.Fatalf("%v: %s, want %s", tc.meta, a, tc.want)
		}
	}
	if n := r.up.Count("create_ticket"); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
	text := scrape(t, r.gw)
	for _, want := range []string{
		`ledgermcp_calls_total{outcome="executed",tool="tickets_create_ticket"} 2`,
		`ledgermcp_calls_total{outcome="replayed",tool="tickets_create_ticket"} 1`,
		`ledgermcp_calls_total{outcome="invalid_request",tool="tickets_create_ticket"} 1`,
		`ledgermcp_call_duration_seconds_count{tool="tickets_create_ticket"} 4`,
		`ledgermcp_upstream_connected{upstream="tickets"} 1`,
		`ledgermcp_upstream_connected{upstream="broken"} 0`,
		`ledgermcp_ledger_serving 1`,
		`go_goroutines `,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the metrics lack %q", want)
		}
	}
	if strings.Contains(text, "Printer") || strings.Contains(text, "metrics-1") {
		t.Error("the metrics hold a call's arguments or key")
	}

	r.ledger.Service.GRPC.Stop()
	deadline := time.Now().Add(10 * time.Second) // the ledger's status is asked at most once a second
	for !strings.Contains(scrape(t, r.gw), "ledgermcp_ledger_serving 0") {
		if time.Now().After(deadline) {
			t.Fatal("ledgermcp_ledger_serving stayed 1 after ledgerd stopped")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
