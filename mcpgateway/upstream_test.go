package mcpgateway_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/mcpgateway"
)

// TestUpstreamConnectionsReused: calls forwarded to an HTTP upstream reuse
// its connections. Rounds of calls at once open about as many connections
// as one round needs, not one per call, whether the call is forwarded
// unrecorded or recorded; every recorded call applies its effect once.
// Closing the gateway closes them all.
func TestUpstreamConnectionsReused(t *testing.T) {
	const rounds, atOnce = 5, 20
	for _, tc := range []struct {
		name, tool string
		args       map[string]any
		keyed      bool // each call a new operation under a key of its own
		effects    int
	}{
		{name: "read-only, unrecorded", tool: "tickets_search_tickets", args: map[string]any{"query": "printer"}},
		{name: "recorded", tool: "tickets_create_ticket", args: ticketArgs, keyed: true, effects: rounds * atOnce},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, rigOptions{upstream: "http"})
			cs := r.stdio(clientOptions{})
			call(t, cs, "tickets_search_tickets", map[string]any{"query": "warm-up"}, nil)
			before := r.upstreamConns.Load()
			for round := range rounds {
				for i, a := range concurrently(atOnce, func(i int) answer {
					var meta mcp.Meta
					if tc.keyed {
						meta = mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, fmt.Sprintf("conn-%d-%d", round, i))}
					}
					return call(t, cs, tc.tool, tc.args, meta)
				}) {
					if a.isError {
						t.Fatalf("round %d, call %d: %v", round, i, a)
					}
				}
			}
			// A connection returns to the pool a moment after its call: a
			// round may dial while the last round's are on their way back.
			// Twice a round's calls bounds that; one per call is 100.
			opened := r.upstreamConns.Load() - before
			t.Logf("%d calls opened %d connections to the upstream", rounds*atOnce, opened)
			if opened > 2*atOnce {
				t.Errorf("%d calls opened %d connections to the upstream, want at most %d", rounds*atOnce, opened, 2*atOnce)
			}
			if got := r.up.Count("create_ticket"); got != tc.effects {
				t.Errorf("create_ticket applied %d times, want %d", got, tc.effects)
			}
			if err := r.gw.Close(); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); r.upstreamOpen.Load() > 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d connections to the upstream still open after the gateway closed", r.upstreamOpen.Load())
				}
			}
		})
	}
}
