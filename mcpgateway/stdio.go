package mcpgateway

import (
	"context"
	"errors"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Serve serves one MCP session over t (mcp.StdioTransport: stdin and
// stdout) until it ends or ctx does. When ctx ends, the session's new tool
// calls are refused (unavailable), and it is closed once every call it
// read has its answer written: go-sdk writes none once a session is
// closing.
func (g *Gateway) Serve(ctx context.Context, t mcp.Transport) error {
	at := &answering{Transport: t, open: map[jsonrpc.ID]struct{}{}, idle: make(chan struct{})}
	ss, err := g.server.Connect(context.WithoutCancel(ctx), at, nil)
	if err != nil {
		return err
	}
	ended := make(chan error, 1)
	go func() { ended <- ss.Wait() }()
	select {
	case err := <-ended:
		return sessionEnd(err)
	case <-ctx.Done():
	}
	g.stopping.Store(ss, struct{}{})
	defer g.stopping.Delete(ss)
	g.log.Info("stopping: new tool calls are refused, and those in flight are let end")
	select {
	case <-at.answered():
	case err := <-ended:
		return sessionEnd(err)
	}
	_ = ss.Close()
	return sessionEnd(<-ended)
}

// sessionEnd is Serve's error for how a session ended: nil when it was
// closed or cancelled.
func sessionEnd(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// answering is a transport whose connection notes the calls it reads
// until their answers are written.
type answering struct {
	mcp.Transport
	mu   sync.Mutex
	open map[jsonrpc.ID]struct{}
	idle chan struct{} // closed, and replaced, whenever no call is open
}

// Connect connects t, noting the calls read and the answers written.
func (a *answering) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := a.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &answeringConn{Connection: c, a: a}, nil
}

// answered returns a channel closed once no call read is unanswered.
func (a *answering) answered() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.open) == 0 {
		done := make(chan struct{})
		close(done)
		return done
	}
	return a.idle
}

// answeringConn is a connection of an answering transport.
type answeringConn struct {
	mcp.Connection
	a *answering
}

// Read reads the next message, and notes a call among them as open. When
// reading ends (the client closed its end, MCP's stdio shutdown) it
// returns only once the calls read are answered: the client reads their
// answers until the gateway exits.
func (c *answeringConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if err != nil {
		select {
		case <-c.a.answered():
		case <-ctx.Done():
		}
		return m, err
	}
	if r, ok := m.(*jsonrpc.Request); ok && r.IsCall() {
		c.a.mu.Lock()
		c.a.open[r.ID] = struct{}{}
		c.a.mu.Unlock()
	}
	return m, err
}

// Write writes m, and notes the call an answer is for as answered.
func (c *answeringConn) Write(ctx context.Context, m jsonrpc.Message) error {
	err := c.Connection.Write(ctx, m)
	if r, ok := m.(*jsonrpc.Response); ok {
		c.a.mu.Lock()
		delete(c.a.open, r.ID)
		if len(c.a.open) == 0 {
			close(c.a.idle)
			c.a.idle = make(chan struct{})
		}
		c.a.mu.Unlock()
	}
	return err
}
