package mcpgateway_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/mcpgateway"
	"github.com/opledger/ledger/mcpgateway/mcptest"
)

// TestToolsAreServedUnderThePrefix: tools/list shows the upstream's tools
// under its prefix, with their descriptions, schemas and annotations; a
// tool the upstream adds later is listed, with a listChanged
// notification (without an output schema the gateway cannot compile), and
// one it removes is gone.
func TestToolsAreServedUnderThePrefix(t *testing.T) {
	r := newRig(t, rigOptions{upstream: "http"})
	changed := make(chan struct{}, 1)
	cs := r.http("", clientOptions{toolsChanged: changed})
	tools := list(t, cs)
	if got, want := names(tools), []string{"tickets_create_ticket", "tickets_find_ticket", "tickets_search_tickets", "tickets_set_status"}; !slices.Equal(got, want) {
		t.Fatalf("tools = %v, want %v", got, want)
	}
	upstream := map[string]*mcp.Tool{}
	for _, tl := range list(t, r.directSession(t)) {
		upstream[tl.Name] = tl
	}
	for _, tl := range tools {
		u := upstream[tl.Name[len("tickets_"):]]
		if tl.Description != u.Description || !reflect.DeepEqual(tl.InputSchema, u.InputSchema) || !reflect.DeepEqual(tl.Annotations, u.Annotations) {
			t.Errorf("%s = %+v, want the upstream's %+v", tl.Name, tl, u)
		}
	}

	// Its output schema refers to another document, which the gateway does
	// not load, nor can the official clients: it is served without one.
	r.server.AddTool(&mcp.Tool{Name: "close_ticket", InputSchema: map[string]any{"type": "object"},
		OutputSchema: map[string]any{"$ref": "https://elsewhere.example/ticket.json"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "closed"}}}, nil
	})
	r.server.RemoveTools("search_tickets")
	want := []string{"tickets_close_ticket", "tickets_create_ticket", "tickets_find_ticket", "tickets_set_status"}
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(names(list(t, cs)), want) {
		select {
		case <-changed:
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("tools = %v, want %v after the upstream's change", names(list(t, cs)), want)
		}
	}
	if a := call(t, cs, "tickets_close_ticket", nil, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "close")}); a.isError || a.text != "closed" {
		t.Fatalf("the new tool = %v", a)
	}
	for _, tl := range list(t, cs) {
		if (tl.OutputSchema != nil) != (tl.Name == "tickets_create_ticket") {
			t.Errorf("%s is served with output schema %v", tl.Name, tl.OutputSchema)
		}
	}
	if _, err := callErr(cs, "tickets_search_tickets", nil, nil); err == nil {
		t.Fatal("the removed tool is still served")
	}
}

// TestSeveralUpstreams: the tools of two upstreams, one over stdio and one
// over Streamable HTTP, are served under their prefixes, and each call
// reaches the upstream whose tool it names.
func TestSeveralUpstreams(t *testing.T) {
	desk := mcptest.New(t.TempDir())
	srv := httptest.NewServer(desk.Handler())
	t.Cleanup(srv.Close)
	r := newRig(t, rigOptions{upstreams: "  - {name: desk, prefix: desk., url: " + srv.URL + "}"})
	cs := r.http("", clientOptions{})
	got := names(list(t, cs))
	for _, want := range []string{"tickets_create_ticket", "desk.create_ticket", "desk.find_ticket"} {
		if !slices.Contains(got, want) {
			t.Fatalf("tools %v: no %s", got, want)
		}
	}
	call(t, cs, "desk.create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "desk")})
	call(t, cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "tickets")})
	call(t, cs, "desk.create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "desk-2")})
	if d, tk := desk.Count("create_ticket"), r.up.Count("create_ticket"); d != 2 || tk != 1 {
		t.Fatalf("desk applied %d effects, tickets %d; want 2 and 1", d, tk)
	}
}

func list(t *testing.T, cs *mcp.ClientSession) []*mcp.Tool {
	t.Helper()
	var out []*mcp.Tool
	for tl, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tl)
	}
	return out
}

func names(tools []*mcp.Tool) []string {
	var out []string
	for _, tl := range tools {
		out = append(out, tl.Name)
	}
	slices.Sort(out)
	return out
}

// directSession connects to the HTTP upstream itself, not through the
// gateway.
func (r *rig) directSession(t *testing.T) *mcp.ClientSession {
	t.Helper()
	cs, err := newClient(clientOptions{}).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: r.httpUpstream.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// TestProgressAndCancellation: a long call's progress reaches the caller,
// and its lease is renewed while it runs; a call the caller cancels after
// the forward is cancelled at the upstream too and recorded as UNKNOWN.
func TestProgressAndCancellation(t *testing.T) {
	r := newRig(t, rigOptions{rules: "- {match: create_ticket, timeout: 10s}"})
	progress := make(chan float64, 100)
	cs := r.stdio(clientOptions{progress: progress})
	r.up.Fault("create_ticket", "slow:3s")
	k := key(t, "slow")
	p := &mcp.CallToolParams{Name: "tickets_create_ticket", Arguments: ticketArgs, Meta: mcp.Meta{mcpgateway.MetaIdempotencyKey: k}}
	p.SetProgressToken("tok-1")
	res, err := cs.CallTool(context.Background(), p)
	if err != nil || res.IsError {
		t.Fatalf("slow call = %+v, %v", res, err)
	}
	if got := len(progress); got < 5 {
		t.Fatalf("%d progress notifications reached the caller, want about 10", got)
	}
	o, err := r.ledgerClient("").Lookup(context.Background(), k)
	if err != nil || o.State != client.StateSucceeded || o.Attempt != 1 {
		t.Fatalf("a call longer than its 2s lease = %+v, %v; want SUCCEEDED in attempt 1 (the lease renewed)", o, err)
	}

	r.up.Fault("create_ticket", "slow:5s")
	k = key(t, "cancelled")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel)
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "tickets_create_ticket", Arguments: ticketArgs, Meta: mcp.Meta{mcpgateway.MetaIdempotencyKey: k}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call = %v", err)
	}
	lc := r.ledgerClient("")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		o, err := lc.Lookup(context.Background(), k)
		if err == nil && o.State == client.StateUnknown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a call cancelled after its forward = %+v, %v; want UNKNOWN", o, err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); r.up.Calls("create_ticket:cancelled") == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upstream never saw the call cancelled")
		}
	}
	if n := r.up.Count("create_ticket"); n != 1 {
		t.Fatalf("%d effects, want 1: the cancelled call must not apply one", n)
	}
}
