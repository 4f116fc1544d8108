// Command tickets is the demo MCP tool server behind the gateway in
// examples/mcp: a ticket desk that opens a ticket on every create_ticket
// call it gets (it honours no idempotency key, like many real tools), and
// can find the ticket a call opened by that call's idempotency key, which
// the gateway passes in _meta. It serves MCP over stdio, or over
// Streamable HTTP with --http ADDR. Tickets live in memory.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Ticket is an opened ticket.
type Ticket struct {
	ID       string `json:"id"`
	Title    string `json:"title"`
	Priority int    `json:"priority"`
}

// desk holds the tickets, and which call opened each.
type desk struct {
	mu      sync.Mutex
	tickets []Ticket
	byKey   map[string]Ticket
}

type createArgs struct {
	Title    string `json:"title" jsonschema:"what is wrong"`
	Priority int    `json:"priority" jsonschema:"1 (urgent) to 5"`
}

func (d *desk) create(_ context.Context, req *mcp.CallToolRequest, a createArgs) (*mcp.CallToolResult, Ticket, error) {
	if a.Title == "" || a.Priority < 1 || a.Priority > 5 {
		return nil, Ticket{}, fmt.Errorf("a ticket needs a title and a priority from 1 to 5")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	t := Ticket{ID: fmt.Sprintf("TCK-%d", 1041+len(d.tickets)), Title: a.Title, Priority: a.Priority}
	d.tickets = append(d.tickets, t)
	if key, ok := req.Params.Meta["idempotencyKey"].(string); ok {
		d.byKey[key] = t
	}
	return nil, t, nil
}

type findArgs struct {
	Key string `json:"idempotency_key" jsonschema:"the idempotency key of the create_ticket call"`
}

// find answers what create_ticket answered under the key, the ticket, so
// that a call the gateway settles with it replays as it would have
// answered; or {"found": false}.
func (d *desk) find(_ context.Context, _ *mcp.CallToolRequest, a findArgs) (*mcp.CallToolResult, any, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t, ok := d.byKey[a.Key]; ok {
		return nil, t, nil
	}
	return nil, map[string]bool{"found": false}, nil
}

type listed struct {
	Tickets []Ticket `json:"tickets"`
}

func (d *desk) list(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, listed, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return nil, listed{Tickets: append([]Ticket{}, d.tickets...)}, nil
}

// newServer returns the desk's MCP server, with no tickets.
func newServer() *mcp.Server {
	d := &desk{byKey: map[string]Ticket{}}
	s := mcp.NewServer(&mcp.Implementation{Name: "tickets", Version: "1.0.0"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "create_ticket", Description: "Open a ticket."}, d.create)
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	mcp.AddTool(s, &mcp.Tool{Name: "find_ticket", Description: "Find the ticket a create_ticket call opened, by its idempotency key.", Annotations: readOnly}, d.find)
	mcp.AddTool(s, &mcp.Tool{Name: "list_tickets", Description: "List every ticket.", Annotations: readOnly}, d.list)
	return s
}

func main() {
	addr := flag.String("http", "", "serve Streamable HTTP on this HOST:PORT instead of stdio")
	flag.Parse()
	s := newServer()
	if *addr == "" {
		if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			log.Fatal(err)
		}
		return
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	fmt.Fprintln(os.Stderr, "tickets: serving MCP on http://"+*addr)
	log.Fatal(http.ListenAndServe(*addr, h))
}
