package mcpgateway_test

import (
	"fmt"
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
// answer names (as many executed as the upstream applied), a command
// upstream's stdout lines that are no messages are counted (and logged
// once, without their text), and the gauges follow the upstreams and the
// ledger.
func TestMetrics(t *testing.T) {
	r := newRig(t, rigOptions{upstreams: "  - name: broken\n    command: [/nonexistent/mcp-server]"})
	r.up.Fault("create_ticket", "print", "print") // 3 lines each on stdout that are no messages
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
		`ledgermcp_upstream_lines_dropped_total{upstream="tickets"} 6`,
		`go_goroutines `,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the metrics lack %q", want)
		}
	}
	if strings.Contains(text, "Printer") || strings.Contains(text, "metrics-1") {
		t.Error("the metrics hold a call's arguments or key")
	}
	if n := strings.Count(r.log.String(), "no JSON-RPC message to stdout"); n != 1 || strings.Contains(r.log.String(), "T-1") {
		t.Errorf("the dropped lines were logged %d times, want once, without their text:\n%s", n, r.log.String())
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

// TestMetricsByTenant: with metrics.tenant_label each call is counted under
// the tenant of the key it acts under: the HTTP caller's, or the gateway's
// own over stdio (TestMetrics: without it, no tenant label).
func TestMetricsByTenant(t *testing.T) {
	creds, keys := apiKeys(t, "reconciler", "acme", "globex", "initech")
	r := newRig(t, rigOptions{creds: creds, apiKeyEnv: "GW_KEY", env: map[string]string{"GW_KEY": keys["initech"]},
		config: "metrics: {tenant_label: true}"})
	sessions := []*mcp.ClientSession{r.http(keys["acme"], clientOptions{}), r.http(keys["globex"], clientOptions{}), r.stdio(clientOptions{})}
	for i, cs := range []*mcp.ClientSession{sessions[0], sessions[1], sessions[0], sessions[2]} {
		meta := mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, fmt.Sprint("call-", i))}
		if a := call(t, cs, "tickets_create_ticket", ticketArgs, meta); a.outcome() != "executed" {
			t.Fatalf("call %d: %s, want executed", i, a)
		}
	}
	if n := r.up.Count("create_ticket"); n != 4 {
		t.Fatalf("%d effects, want 4", n)
	}
	text := scrape(t, r.gw)
	for _, want := range []string{
		`ledgermcp_calls_total{outcome="executed",tenant="acme",tool="tickets_create_ticket"} 2`,
		`ledgermcp_calls_total{outcome="executed",tenant="globex",tool="tickets_create_ticket"} 1`,
		`ledgermcp_calls_total{outcome="executed",tenant="initech",tool="tickets_create_ticket"} 1`,
		`ledgermcp_call_duration_seconds_count{tenant="acme",tool="tickets_create_ticket"} 2`,
		`ledgermcp_call_duration_seconds_count{tenant="initech",tool="tickets_create_ticket"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the metrics lack %q", want)
		}
	}
	for _, k := range keys {
		if strings.Contains(text, k) {
			t.Error("the metrics hold an API key")
		}
	}
}
