package mcpgateway_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/mcpgateway"
)

// TestServeStopsItsSession: Serve's context ends (a stdio gateway's
// SIGTERM) while a call is in flight: Serve returns only once that call is
// answered (executed, recorded), and refuses the session's new calls
// meanwhile, forwarding nothing; another session of the same gateway is
// served as before.
func TestServeStopsItsSession(t *testing.T) {
	r := newRig(t, rigOptions{rules: "- {match: create_ticket, timeout: 10s}"})
	cs, stop := r.stdioStoppable(clientOptions{})
	other := r.stdio(clientOptions{})
	r.up.Fault("create_ticket", "slow:2s")
	k := key(t, "in-flight")
	got := make(chan answer, 1)
	go func() {
		// Read without checkOutput: the session is closed by the time it
		// would list the tools.
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "tickets_create_ticket", Arguments: ticketArgs, Meta: mcp.Meta{mcpgateway.MetaIdempotencyKey: k}})
		if err != nil {
			got <- answer{isError: true, text: err.Error()}
			return
		}
		got <- read(res)
	}()
	ledgertest.Await(t, "the upstream gets the call", func() bool { return r.up.Calls("create_ticket") > 0 })
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	ledgertest.Await(t, "the log line \"stopping: new tool calls are refused\"", func() bool { return strings.Contains(r.log.String(), "stopping: new tool calls are refused") })
	if late := call(t, cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "late")}); !late.isError || late.outcome() != "unavailable" {
		t.Fatalf("a call while its session stops = %v; want unavailable", late)
	}
	if a := call(t, other, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "other")}); a.isError || a.outcome() != "executed" {
		t.Fatalf("a call of another session = %v; want executed", a)
	}
	if a := <-got; a.isError || a.outcome() != "executed" || a.ticket == "" {
		t.Fatalf("the call in flight when Serve's context ended = %v; want executed, with its ticket", a)
	}
	<-stopped
	if n, calls := r.up.Count("create_ticket"), r.up.Calls("create_ticket"); n != 2 || calls != 2 {
		t.Fatalf("%d effects of %d calls upstream, want 2 of 2 (the call in flight and the other session's)", n, calls)
	}
}

// TestServeAnswersBeforeEOF: the client closes the gateway's stdin (MCP's
// stdio shutdown) while a call is in flight, and reads on: the call is
// answered (executed, recorded) before the session ends.
func TestServeAnswersBeforeEOF(t *testing.T) {
	r := newRig(t, rigOptions{rules: "- {match: create_ticket, timeout: 10s}"})
	gr, cw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cr, gw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- r.gw.Serve(context.Background(), &mcp.IOTransport{Reader: gr, Writer: gw}) }()
	lines := bufio.NewScanner(cr)
	lines.Buffer(nil, 1<<20)
	send := func(msg string) {
		if _, err := io.WriteString(cw, msg+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"agent","version":"1"}}}`)
	if !lines.Scan() || !strings.Contains(lines.Text(), `"id":1,"result"`) {
		t.Fatalf("initialize: %q %v", lines.Text(), lines.Err())
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	r.up.Fault("create_ticket", "slow:1s")
	k := key(t, "eof")
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"tickets_create_ticket","arguments":{"title":"Printer on fire","priority":2},"_meta":{"` +
		mcpgateway.MetaIdempotencyKey + `":"` + k + `"}}}`)
	ledgertest.Await(t, "the upstream gets the call", func() bool { return r.up.Calls("create_ticket") > 0 })
	_ = cw.Close()
	var answer string
	for lines.Scan() {
		if strings.Contains(lines.Text(), `"id":2`) {
			answer = lines.Text()
		}
	}
	if err := <-served; err != nil || !strings.Contains(answer, `"outcome":"executed"`) {
		t.Fatalf("Serve = %v; the call's answer %q, want executed", err, answer)
	}
	if o, err := r.ledgerClient("").Lookup(context.Background(), k); err != nil || o.State != client.StateSucceeded || r.up.Count("create_ticket") != 1 {
		t.Fatalf("operation = %+v, %v, %d effects; want SUCCEEDED, one effect", o, err, r.up.Count("create_ticket"))
	}
}
