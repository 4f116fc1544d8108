package mcpgateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/mcpgateway"
	"github.com/opledger/ledger/mcpgateway/mcptest"
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

// TestToolListChanges: the gateway lists an upstream's tools again when
// it says they changed, one listing at a time, and serves the last one.
// Notices that come while a listing is on its way make one more listing,
// not one each: an upstream that says so forty times costs two listings.
// A listing slower than the one after it does not bring its older tools
// back.
func TestToolListChanges(t *testing.T) {
	const copies = 20 // each notice the upstream sends arrives this many times
	r := newRig(t, rigOptions{upstream: "http"})
	var (
		listings atomic.Int64 // tools/list answered by the upstream
		notices  atomic.Int64 // list_changed notices sent
		hold     = make(chan struct{})
		held     = make(chan struct{})
		holding  atomic.Bool
	)
	r.server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if method == "tools/list" {
				if holding.CompareAndSwap(true, false) {
					close(held)
					<-hold // answers with the tools it listed before the change below
				}
				listings.Add(1)
			}
			return res, err
		}
	})
	r.server.AddSendingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != "notifications/tools/list_changed" {
				return next(ctx, method, req)
			}
			for range copies - 1 {
				notices.Add(1)
				_, _ = next(ctx, method, req)
			}
			notices.Add(1)
			return next(ctx, method, req)
		}
	})
	cs := r.http("", clientOptions{})
	before := listings.Load()
	add := func(name string) {
		r.server.AddTool(&mcp.Tool{Name: name, InputSchema: map[string]any{"type": "object"}},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name}}}, nil
			})
	}

	holding.Store(true)
	add("close_ticket")
	<-held // the first listing after the change is on its way, and holds
	add("merge_tickets")
	for notices.Load() < 2*copies {
		time.Sleep(10 * time.Millisecond)
	}
	// Give the gateway time to act on the notices: listings that do not
	// wait for the held one answer in a few milliseconds each.
	for deadline := time.Now().Add(time.Second); listings.Load() < before+2*copies-1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	close(hold)

	want := []string{"tickets_close_ticket", "tickets_create_ticket", "tickets_find_ticket", "tickets_merge_tickets", "tickets_search_tickets", "tickets_set_status"}
	settled := 0
	for deadline := time.Now().Add(10 * time.Second); settled < 20; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("tools = %v, want %v after the upstream's changes", names(list(t, cs)), want)
		}
		settled++
		if !slices.Equal(names(list(t, cs)), want) {
			settled = 0
		}
	}
	if n := listings.Load() - before; n > 3 {
		t.Errorf("%d notices made %d listings, want at most 3", notices.Load(), n)
	}
	t.Logf("%d notices made %d listings", notices.Load(), listings.Load()-before)
}

// TestProgressStaysWithItsUpstream: a caller gets the progress of its own
// call only, not what another upstream sends under the tokens the gateway
// gives its calls.
func TestProgressStaysWithItsUpstream(t *testing.T) {
	desk := mcptest.New(t.TempDir())
	srv := desk.Server()
	var sent atomic.Int64
	srv.AddTool(&mcp.Tool{Name: "spoof", InputSchema: map[string]any{"type": "object"}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			for i := range 100 {
				tok := "ledgermcp-" + strconv.Itoa(i)
				if req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 999, Message: "spoofed"}) == nil {
					sent.Add(1)
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	r := newRig(t, rigOptions{rules: "- {match: create_ticket, timeout: 10s}",
		upstreams: "  - {name: desk, prefix: desk., url: " + hs.URL + ", tools: [{match: spoof, effect: read_only, key: none}]}"})
	progress := make(chan float64, 1000)
	cs := r.stdio(clientOptions{progress: progress})
	r.up.Fault("create_ticket", "slow:2s")
	done := make(chan struct{})
	go func() {
		p := &mcp.CallToolParams{Name: "tickets_create_ticket", Arguments: ticketArgs, Meta: mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "slow")}}
		p.SetProgressToken("tok-1")
		res, err := cs.CallTool(context.Background(), p)
		if err != nil || res.IsError {
			t.Errorf("slow call = %+v, %v", res, err)
		}
		close(done)
	}()
	for len(progress) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	call(t, r.http("", clientOptions{}), "desk.spoof", nil, nil)
	<-done
	close(progress)
	var mine int
	for p := range progress {
		if p == 999 {
			t.Fatalf("a caller got another upstream's progress (%d sent)", sent.Load())
		}
		mine++
	}
	if mine < 5 || sent.Load() == 0 {
		t.Fatalf("%d of the call's progress notifications reached the caller, %d spoofed ones sent", mine, sent.Load())
	}
}

// TestListingLimits: a listing whose pages never end, or that lists more
// tools than the gateway serves, is refused at once and said so in the
// log, on a notice and on a new session; the tools listed before stay
// served.
func TestListingLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		page func(*mcp.ListToolsResult) // rewrites each page the upstream answers
		log  string
	}{
		{"a cursor that never ends", func(res *mcp.ListToolsResult) { res.NextCursor = "more" }, "more than 1000 pages"},
		{"too many tools", func(res *mcp.ListToolsResult) {
			for len(res.Tools) <= 10000 {
				res.Tools = append(res.Tools, res.Tools[0])
			}
		}, "more than 10000 tools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, rigOptions{upstream: "http"})
			cs := r.http("", clientOptions{})
			before := names(list(t, cs))
			var pages atomic.Int64
			r.server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
				return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
					if method != "tools/list" {
						return next(ctx, method, req)
					}
					req.GetParams().(*mcp.ListToolsParams).Cursor = ""
					res, err := next(ctx, method, req)
					if err == nil {
						pages.Add(1)
						tc.page(res.(*mcp.ListToolsResult))
					}
					return res, err
				}
			})
			r.server.AddTool(&mcp.Tool{Name: "close_ticket", InputSchema: map[string]any{"type": "object"}},
				func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					return &mcp.CallToolResult{}, nil
				})
			r.waitLog(t, tc.log)
			// A new session's first listing is refused too, and said so.
			r.restartHTTP()
			r.httpUpstream.CloseClientConnections()
			r.waitLog(t, "upstream tools not listed")
			if got := names(list(t, cs)); !slices.Equal(got, before) {
				t.Errorf("tools = %v after the refused listing, want %v", got, before)
			}
			t.Logf("%d pages asked for", pages.Load())
		})
	}
}

// TestUpstreamURLNotLogged: a URL upstream's path and query, which may
// hold its key (read from the environment with ${NAME}), never reach the
// gateway's log, whose errors name its scheme and host and say when the
// gateway tries again (in milliseconds, as the logs' other durations).
func TestUpstreamURLNotLogged(t *testing.T) {
	addr := ledgertest.ClosedAddr(t)
	r := newRig(t, rigOptions{env: map[string]string{"HOSTED_KEY": "hunter2"},
		upstreams: "  - name: hosted\n    url: http://" + addr + "/s/${HOSTED_KEY}/mcp?key=${HOSTED_KEY}"})
	r.waitLog(t, `upstream unreachable" upstream=hosted retry_in_ms=1000 `)
	if logs := r.log.String(); strings.Contains(logs, "hunter2") || !strings.Contains(logs, "http://"+addr+"/…") {
		t.Fatalf("the log quotes the upstream's key, or not its host:\n%s", logs)
	}
}
