package mcpgateway

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/ledger"
)

// Version is the gateway's version in the MCP handshake.
const Version = "0.1.0"

// RunIDEnv names the environment variable a launching agent may set to
// scope a stdio gateway's derived operation ids to its run.
const RunIDEnv = "LEDGER_RUN_ID"

// instructions tell the model what the gateway does with its calls.
const instructions = "Tool calls made through this gateway are recorded in an operation ledger. " +
	"A tool that changes something runs at most once per operation: repeating a call with the same arguments " +
	"soon after it returns the first call's answer instead of running it again. " +
	"When an answer says the outcome of an earlier call is unknown, do not work around it with changed arguments: " +
	"call again later, or ask a human."

// Gateway serves the tools of its upstreams over MCP, each call through
// the ledger. It is safe for concurrent use.
type Gateway struct {
	cfg       *Config
	log       *slog.Logger
	server    *mcp.Server
	conn      *grpc.ClientConn
	upstreams []*upstream
	intents   intents
	auth      verifier
	health    ledgerHealth
	metrics   *metrics
	own       ownTenant
	// stdioScope scopes the operation ids a stdio session derives: the
	// launching agent's run id, or one for this process.
	stdioScope string

	// serving lets one upstream's listing at a time change the tools
	// served, so that the server's list follows tools.
	serving sync.Mutex

	mu      sync.Mutex
	tools   map[string]*tool          // by served name
	clients map[string]*client.Client // by API key ("" for none)

	stop context.CancelFunc
	done sync.WaitGroup
	// posts are the MCP requests (POSTs) being served over HTTP: each
	// ends once its answer is written.
	posts inflight
	// stopping holds the sessions Serve is closing (their context ended):
	// their new tool calls are refused.
	stopping sync.Map // *mcp.ServerSession -> struct{}
}

// inflight counts the requests being served, so that Close lets them end.
type inflight struct {
	mu      sync.Mutex
	n       int
	closing bool
	wg      sync.WaitGroup
}

// begin counts a request in; false once Close has begun.
func (c *inflight) begin() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return false
	}
	c.n++
	c.wg.Add(1)
	return true
}

// end counts a request out.
func (c *inflight) end() {
	c.mu.Lock()
	c.n--
	c.mu.Unlock()
	c.wg.Done()
}

// close refuses new requests and returns how many are being served.
func (c *inflight) close() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing = true
	return c.n
}

// ownTenant is the tenant of the gateway's own key, once the ledger said.
type ownTenant struct {
	mu     sync.Mutex
	tenant string
}

// tool is one served tool.
type tool struct {
	name   string // served name, and the ledger's tool
	remote string // the upstream's name for it
	up     *upstream
	policy policy
	output *outputCheck // its output schema, which answers are checked against; nil for none
}

// New returns a gateway for cfg; Start connects it.
func New(cfg *Config, log *slog.Logger) (*Gateway, error) {
	if id := os.Getenv(RunIDEnv); id != "" {
		if err := ledger.ValidateRunID(id); err != nil {
			return nil, fmt.Errorf("%s: %w", RunIDEnv, err) // every call would be refused for it
		}
	}
	creds := insecure.NewCredentials()
	if cfg.Ledger.TLS != nil {
		t, err := clientTLS(cfg.Ledger.TLS)
		if err != nil {
			return nil, fmt.Errorf("ledger.tls: %w", err)
		}
		creds = credentials.NewTLS(t)
	}
	conn, err := grpc.NewClient(cfg.Ledger.Address, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("ledger.address: %w", err)
	}
	g := &Gateway{
		cfg:     cfg,
		log:     log,
		conn:    conn,
		tools:   map[string]*tool{},
		clients: map[string]*client.Client{},
	}
	g.auth.g = g
	g.stdioScope = os.Getenv(RunIDEnv)
	if g.stdioScope == "" {
		g.stdioScope = "stdio-" + rand.Text()
	}
	g.server = mcp.NewServer(&mcp.Implementation{Name: "ledgermcp", Version: Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       log,
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
	})
	for _, u := range cfg.Upstreams {
		g.upstreams = append(g.upstreams, newUpstream(g, u))
	}
	g.metrics = newMetrics(g)
	return g, nil
}

// Start connects to the upstreams, waiting up to wait for each to answer
// once (or fail), and starts the background reconciliation. Upstreams
// that cannot be reached are tried again in the background.
func (g *Gateway) Start(ctx context.Context, wait time.Duration) {
	ctx, g.stop = context.WithCancel(ctx)
	var first sync.WaitGroup
	for _, u := range g.upstreams {
		first.Add(1)
		g.done.Add(1)
		go func() {
			defer g.done.Done()
			u.keep(ctx, sync.OnceFunc(first.Done))
		}()
	}
	waited := make(chan struct{})
	go func() { first.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(wait):
	}
	g.done.Add(1)
	go func() {
		defer g.done.Done()
		g.reconcileLoop(ctx)
	}()
}

// Close refuses new MCP requests over HTTP (503) and waits for those
// being served to end, each within its tools' timeouts and wait, so that
// their outcomes are recorded and their answers written; then it stops
// the background work, the upstreams' sessions (and commands) and the
// connection to the ledger. Over stdio, Serve has let its calls end and
// answered them by the time it returns.
func (g *Gateway) Close() error {
	if n := g.posts.close(); n > 0 {
		g.log.Info("waiting for the requests in flight to end", "requests", n)
	}
	g.posts.wg.Wait()
	if g.stop != nil {
		g.stop()
	}
	for _, u := range g.upstreams {
		u.close()
	}
	g.done.Wait()
	return g.conn.Close()
}

// serve makes tools, listed by u, the ones served for it: new ones are
// added, changed ones replaced, missing ones removed. A tool whose served
// name is another upstream's tool is left out. The caller holds
// u.listing.
func (g *Gateway) serve(u *upstream, tools []*mcp.Tool) {
	defs := map[string]*mcp.Tool{}
	next := map[string]*tool{}
	applied := make([]bool, len(u.cfg.Tools))
	for _, t := range tools {
		def, err := served(t, *u.cfg.Prefix)
		if err != nil {
			g.log.Warn("upstream tool not served", "upstream", u.cfg.Name, "tool", t.Name, "error", err)
			continue
		}
		output, err := u.outputs.compile(t.OutputSchema)
		if err != nil {
			g.log.Warn("upstream tool served without its output schema", "upstream", u.cfg.Name, "tool", t.Name, "error", err)
			def.OutputSchema = nil
		}
		pol, rule := resolve(t, u.cfg.Tools, g.cfg.Defaults)
		if rule >= 0 {
			applied[rule] = true
		}
		defs[def.Name] = def
		next[def.Name] = &tool{name: def.Name, remote: t.Name, up: u, policy: pol, output: output}
	}
	u.outputs.done()
	g.warnUnapplied(u, applied)
	g.serving.Lock()
	defer g.serving.Unlock()
	g.mu.Lock()
	var gone []string
	for name, t := range g.tools {
		if t.up == u && next[name] == nil {
			gone = append(gone, name)
			delete(g.tools, name)
		}
	}
	var add []*mcp.Tool
	for name, t := range next {
		if cur := g.tools[name]; cur != nil && cur.up != u {
			g.log.Warn("upstream tool not served: another upstream's tool has its name", "upstream", u.cfg.Name, "tool", name)
			continue
		}
		g.tools[name] = t
		add = append(add, defs[name])
	}
	g.mu.Unlock()
	if len(gone) > 0 {
		g.server.RemoveTools(gone...)
	}
	for _, def := range add {
		g.server.AddTool(def, g.handler(def.Name))
	}
	g.log.Info("upstream tools served", "upstream", u.cfg.Name, "tools", len(add), "removed", len(gone))
}

// warnUnapplied logs each of u's tool rules that no tool served for u
// took (applied, by index): its match finds none, or finds only tools an
// earlier rule took first. Such a rule is a typo or in the wrong place,
// and the tools it was meant for run under another rule or the defaults.
func (g *Gateway) warnUnapplied(u *upstream, applied []bool) {
	for i, took := range applied {
		if !took {
			g.log.Warn("tool rule applies to no tool: its match finds none, or an earlier rule takes them first",
				"upstream", u.cfg.Name, "rule", i, "match", u.cfg.Tools[i].Match)
		}
	}
}

// served is the definition of an upstream tool as the gateway serves it:
// under the prefixed name, with an object input schema.
func served(t *mcp.Tool, prefix string) (*mcp.Tool, error) {
	def := *t
	def.Name = prefix + t.Name
	if err := ledger.ValidateTool(def.Name); err != nil {
		return nil, fmt.Errorf("the name %q is not one the ledger records: %w", def.Name, err)
	}
	switch s := t.InputSchema.(type) {
	case nil:
		def.InputSchema = map[string]any{"type": "object"}
	case map[string]any:
		switch s["type"] {
		case "object":
		case nil:
			m := map[string]any{"type": "object"}
			for k, v := range s {
				m[k] = v
			}
			m["type"] = "object"
			def.InputSchema = m
		default:
			return nil, fmt.Errorf("input schema of type %v, not object", s["type"])
		}
	default:
		return nil, fmt.Errorf("input schema of Go type %T", s)
	}
	return &def, nil
}

// tool returns the served tool named name.
func (g *Gateway) tool(name string) *tool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tools[name]
}

// ledger returns the ledger client that acts under key ("" for none).
func (g *Gateway) ledger(key string) *client.Client {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.clients[key]; c != nil {
		return c
	}
	opts := []client.Option{client.WithReportTimeout(30 * time.Second)}
	if key != "" {
		opts = append(opts, client.WithAPIKey(key))
	}
	c := client.New(g.conn, opts...)
	g.clients[key] = c
	return c
}

// clientTLS is the TLS configuration of the connection to ledgerd.
func clientTLS(c *ClientTLS) (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, err
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate in it", c.CAFile)
		}
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, err
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}
