package mcpgateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/opledger/ledger/mcpgateway"
)

// TestHealth: the probe answers 200 only while the ledger serves and an
// upstream holds a session, says how many do, and names none of them.
func TestHealth(t *testing.T) {
	for _, tc := range []struct {
		name   string
		o      rigOptions
		before func(r *rig)
		method string
		code   int
		want   mcpgateway.Health
	}{
		{name: "serving", code: 200,
			want: mcpgateway.Health{Status: "SERVING", Ledger: "SERVING", Upstreams: 1, Connected: 1}},
		{name: "one upstream of two", code: 200,
			o:    rigOptions{upstreams: "  - name: broken\n    command: [/nonexistent/mcp-server]"},
			want: mcpgateway.Health{Status: "SERVING", Ledger: "SERVING", Upstreams: 2, Connected: 1}},
		{name: "no upstream", code: 503, o: rigOptions{upstream: "missing"},
			want: mcpgateway.Health{Status: "NOT_SERVING", Ledger: "SERVING", Upstreams: 1, Connected: 0}},
		{name: "ledger stopped", code: 503, before: func(r *rig) { r.ledger.Service.GRPC.Stop() },
			want: mcpgateway.Health{Status: "NOT_SERVING", Ledger: "UNREACHABLE", Upstreams: 1, Connected: 1}},
		{name: "HEAD", method: http.MethodHead, code: 200},
		{name: "POST", method: http.MethodPost, code: 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.o)
			if tc.before != nil {
				tc.before(r)
			}
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			req, err := http.NewRequest(method, strings.TrimSuffix(r.url, r.cfg.HTTP.Path)+mcpgateway.HealthPath, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.code {
				t.Fatalf("%s: %d %s, want %d", method, res.StatusCode, body, tc.code)
			}
			if method != http.MethodGet {
				return
			}
			var got mcpgateway.Health
			if err := json.Unmarshal(body, &got); err != nil || got != tc.want {
				t.Errorf("body %s (%v), want %+v", body, err, tc.want)
			}
			if strings.Contains(string(body), "tickets") || strings.Contains(string(body), "broken") {
				t.Errorf("body %s names an upstream", body)
			}
		})
	}
}
