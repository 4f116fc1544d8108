package mcpgateway_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
	"github.com/opledger/ledger/mcpgateway"
	"github.com/opledger/ledger/mcpgateway/mcptest"
	"github.com/opledger/ledger/server"
)

func TestMain(m *testing.M) {
	mcptest.ServeStdioIfAsked()
	redistest.Main(m)
}

// ledgerPolicy gives the tools a short lease, so a lost claim shows soon.
const ledgerPolicy = `
tools:
  - match: "*"
    lease: 2s
`

// rig is a ledger on the shared redis-server, the fake upstream and a
// gateway in front of it, stopped when the test ends.
type rig struct {
	t      *testing.T
	up     *mcptest.Upstream
	ledger *servicetest.Stack
	gw     *mcpgateway.Gateway
	cfg    *mcpgateway.Config
	url    string // the gateway's Streamable HTTP endpoint
	log    *ledgertest.Buffer
	server *mcp.Server // the fake's server, when it is served over HTTP
	// httpUpstream serves it then, with httpHandler.
	httpUpstream *httptest.Server
	httpHandler  atomic.Pointer[mcp.StreamableHTTPHandler]
	jsonAnswers  bool // it answers JSON, not event streams
	resumable    bool // its event streams have ids, and resume
	// refuse is an HTTP status the HTTP upstream answers its next
	// tools/call with, instead of serving it (0: none).
	refuse atomic.Int32
	// goneAs400 has the HTTP upstream answer 400 where it would answer
	// 404 (a session it does not hold).
	goneAs400 atomic.Bool
	// cutStreams has the HTTP upstream end each GET event stream after a
	// moment, as a proxy ending idle streams does; streamsCut counts them,
	// streamsResumed those asked for with the last event's id.
	cutStreams                 atomic.Bool
	streamsCut, streamsResumed atomic.Int64
	// refuseStreams has it answer each GET 405, as a server that offers
	// no event stream does; streamsRefused counts them.
	refuseStreams  atomic.Bool
	streamsRefused atomic.Int64
	// upstreamConns counts the connections the HTTP upstream accepted,
	// upstreamOpen those of them still open.
	upstreamConns, upstreamOpen atomic.Int64
}

// refused answers req with r.refuse, once, when it is a tools/call; it
// reports whether it did.
func (r *rig) refused(w http.ResponseWriter, req *http.Request) bool {
	if r.refuse.Load() == 0 || req.Method != http.MethodPost {
		return false
	}
	body, err := io.ReadAll(req.Body)
	req.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil || !bytes.Contains(body, []byte(`"method":"tools/call"`)) {
		return false
	}
	status := int(r.refuse.Swap(0))
	http.Error(w, http.StatusText(status), status)
	return true
}

// notFoundAs400 writes 400 where its handler writes 404.
type notFoundAs400 struct{ http.ResponseWriter }

func (w notFoundAs400) WriteHeader(code int) {
	if code == http.StatusNotFound {
		code = http.StatusBadRequest
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w notFoundAs400) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// retrySoon starts an event stream with a retry field of 10 ms, so that
// the client comes back at once when the stream ends.
type retrySoon struct{ http.ResponseWriter }

func (w retrySoon) WriteHeader(code int) {
	w.ResponseWriter.WriteHeader(code)
	if code == http.StatusOK {
		_, _ = io.WriteString(w.ResponseWriter, "retry: 10\n\n")
	}
}

func (w retrySoon) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// cut has req, when it is a GET, answered with retrySoon, and ends it
// after 50 ms when cutStreams is set. It reports false when it answered
// req itself (refuseStreams).
func (r *rig) cut(w http.ResponseWriter, req *http.Request) (http.ResponseWriter, *http.Request, func(), bool) {
	if req.Method != http.MethodGet {
		return w, req, func() {}, true
	}
	if r.refuseStreams.Load() {
		r.streamsRefused.Add(1)
		http.Error(w, "no event stream here", http.StatusMethodNotAllowed)
		return w, req, func() {}, false
	}
	if !r.cutStreams.Load() {
		return retrySoon{w}, req, func() {}, true
	}
	r.streamsCut.Add(1)
	if req.Header.Get("Last-Event-ID") != "" {
		r.streamsResumed.Add(1)
	}
	ctx, cancel := context.WithTimeout(req.Context(), 50*time.Millisecond)
	return retrySoon{w}, req.WithContext(ctx), cancel, true
}

// restartHTTP gives the HTTP upstream a new handler, as a restarted
// server has: the sessions of the old one are unknown to it.
func (r *rig) restartHTTP() {
	opts := &mcp.StreamableHTTPOptions{JSONResponse: r.jsonAnswers}
	if r.resumable {
		opts.EventStore = mcp.NewMemoryEventStore(nil)
	}
	r.httpHandler.Store(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return r.server }, opts))
}

type rigOptions struct {
	// upstream is how the gateway reaches the fake: "stdio" (a command),
	// "http", "http-json" (answering JSON, not event streams) or
	// "http-resumable" (event streams with ids, resumed); "stdio"
	// when empty; "missing" names a command that does not exist instead.
	upstream string
	// rules are the upstream's tool rules, as YAML list items.
	rules string
	// config is more YAML at the top level of the gateway's file, and
	// upstreams more entries of its upstreams list.
	config, upstreams string
	creds             *server.Credentials
	// env is the gateway's environment; apiKeyEnv names its own key there.
	env       map[string]string
	apiKeyEnv string
	// ledgerTLS, when set, has the ledger serve TLS with it; ledgerYAML is
	// more YAML under the gateway's ledger key (its tls, as lines of
	// "  key: value"); ledgerAddr, when set, is the address the gateway
	// is given for the ledger instead of the ledger's.
	ledgerTLS              *tls.Config
	ledgerYAML, ledgerAddr string
	// ledgerPolicy is the ledger's policy document (ledgerPolicy when
	// empty).
	ledgerPolicy string
	// wrap, when set, wraps the gateway's HTTP handler.
	wrap func(http.Handler) http.Handler
}

func newRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	r := &rig{t: t, up: mcptest.New(t.TempDir()), log: &ledgertest.Buffer{}}
	r.ledger = servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{Policy: cmp.Or(o.ledgerPolicy, ledgerPolicy), Credentials: o.creds,
		Prefix: "mcp-" + client.NewHolder()[2:14], TLS: o.ledgerTLS}) // a ledger of its own: the gateways of other tests reconcile theirs
	var up string
	switch o.upstream {
	case "", "stdio":
		up = fmt.Sprintf("command: [%q]\n    env: {%s: %q}", os.Args[0], mcptest.StdioEnv, r.up.Dir)
	case "http", "http-json", "http-resumable":
		r.server, r.jsonAnswers, r.resumable = r.up.Server(), o.upstream == "http-json", o.upstream == "http-resumable"
		r.restartHTTP()
		r.httpUpstream = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if r.refused(w, req) {
				return
			}
			if r.goneAs400.Load() {
				w = notFoundAs400{w}
			}
			w, req, done, serve := r.cut(w, req)
			defer done()
			if serve {
				r.httpHandler.Load().ServeHTTP(w, req)
			}
		}))
		r.httpUpstream.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				r.upstreamConns.Add(1)
				r.upstreamOpen.Add(1)
			case http.StateClosed, http.StateHijacked:
				r.upstreamOpen.Add(-1)
			}
		}
		r.httpUpstream.Start()
		t.Cleanup(r.httpUpstream.Close)
		up = "url: " + r.httpUpstream.URL
	case "missing":
		up = fmt.Sprintf("command: [%q]", filepath.Join(t.TempDir(), "no-such-server"))
	}
	if o.creds == nil && !strings.Contains(o.config, "http:") {
		// A ledger without authentication: so is the gateway's listener.
		o.config += "\nhttp: {anonymous: true}"
	}
	ledgerKey := ""
	if o.apiKeyEnv != "" {
		ledgerKey = "\n  api_key_env: " + o.apiKeyEnv
	}
	if o.ledgerYAML != "" {
		ledgerKey += "\n" + o.ledgerYAML
	}
	addr := cmp.Or(o.ledgerAddr, r.ledger.Addr)
	doc := fmt.Sprintf("ledger:\n  address: %s%s\n%s\nreconcile:\n  interval: 200ms\nupstreams:\n  - name: tickets\n    %s\n    tools:\n%s\n%s\n",
		addr, ledgerKey, o.config, up, indent(o.rules, "      "), o.upstreams)
	lookup := func(k string) (string, bool) { v, ok := o.env[k]; return v, ok }
	cfg, err := mcpgateway.ParseConfig([]byte(doc), lookup)
	if err != nil {
		t.Fatalf("config:\n%s\n%v", doc, err)
	}
	r.cfg = cfg
	r.gw, err = mcpgateway.New(cfg, slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	r.gw.Start(context.Background(), 20*time.Second)
	t.Cleanup(func() { _ = r.gw.Close() })
	h := r.gw.Handler()
	if o.wrap != nil {
		h = o.wrap(h)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	r.url = hs.URL + cfg.HTTP.Path
	return r
}

func indent(s, by string) string {
	if strings.TrimSpace(s) == "" {
		return by + "[]"
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := range lines {
		lines[i] = by + lines[i]
	}
	return strings.Join(lines, "\n")
}

// clientOptions let a test see what the gateway sends a client.
type clientOptions struct {
	toolsChanged chan struct{}
	progress     chan float64
}

// stdio connects an MCP client to the gateway over a pair of pipes, the
// stdio transport's framing.
func (r *rig) stdio(o clientOptions) *mcp.ClientSession {
	r.t.Helper()
	cs, _ := r.stdioStoppable(o)
	return cs
}

// stdioStoppable is stdio, and returns a function that ends the context
// the gateway serves the session under (its SIGTERM) and waits for Serve
// to return.
func (r *rig) stdioStoppable(o clientOptions) (*mcp.ClientSession, func()) {
	r.t.Helper()
	cr, gw, err := os.Pipe()
	if err != nil {
		r.t.Fatal(err)
	}
	gr, cw, err := os.Pipe()
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = r.gw.Serve(ctx, &mcp.IOTransport{Reader: gr, Writer: gw})
	}()
	cs, err := newClient(o).Connect(context.Background(), &mcp.IOTransport{Reader: cr, Writer: cw}, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		_ = cs.Close()
		cancel()
		<-served
	})
	return cs, func() { cancel(); <-served }
}

// http connects an MCP client to the gateway over Streamable HTTP, with
// key as its bearer token ("" for none).
func (r *rig) http(key string, o clientOptions) *mcp.ClientSession {
	r.t.Helper()
	cs, err := r.dialHTTP(key, o)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func (r *rig) dialHTTP(key string, o clientOptions) (*mcp.ClientSession, error) {
	hc := &http.Client{Transport: bearer{key: key, next: http.DefaultTransport}}
	return newClient(o).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: r.url, HTTPClient: hc}, nil)
}

func newClient(o clientOptions) *mcp.Client {
	opts := &mcp.ClientOptions{}
	if o.toolsChanged != nil {
		opts.ToolListChangedHandler = func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case o.toolsChanged <- struct{}{}:
			default:
			}
		}
	}
	if o.progress != nil {
		opts.ProgressNotificationHandler = func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			o.progress <- req.Params.Progress
		}
	}
	return mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, opts)
}

type bearer struct {
	key  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.key != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+b.key)
	}
	return b.next.RoundTrip(r)
}

// ledgerClient reads the ledger as the test's tenant (key "" for none).
func (r *rig) ledgerClient(key string) *client.Client {
	opts := []client.Option{}
	if key != "" {
		opts = append(opts, client.WithAPIKey(key))
	}
	c, err := client.Dial(r.ledger.Addr, opts...)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = c.Close() })
	return c
}

// answer is what a test reads of a call's answer.
type answer struct {
	isError bool
	text    string
	ticket  string // structuredContent.id
	ledger  map[string]any
}

func (a answer) outcome() string { s, _ := a.ledger["outcome"].(string); return s }
func (a answer) id() string      { s, _ := a.ledger["operationId"].(string); return s }

func (a answer) String() string {
	return fmt.Sprintf("{isError:%v outcome:%s id:%s ticket:%s text:%q}", a.isError, a.outcome(), a.id(), a.ticket, a.text)
}

// call calls a tool and reads its answer; a protocol error fails the test.
func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, meta mcp.Meta) answer {
	t.Helper()
	res, err := callErr(cs, name, args, meta)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

func callErr(cs *mcp.ClientSession, name string, args map[string]any, meta mcp.Meta) (answer, error) {
	var m mcp.Meta // the SDK writes to it
	if meta != nil {
		m = mcp.Meta{}
		for k, v := range meta {
			m[k] = v
		}
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args, Meta: m})
	if err != nil {
		return answer{}, err
	}
	return read(res), checkOutput(cs, name, res)
}

// callLater calls tickets_create_ticket with ticketArgs and meta in the
// background, and sends its answer on the channel it returns; an error is
// the answer's text.
func callLater(cs *mcp.ClientSession, meta mcp.Meta) <-chan answer {
	got := make(chan answer, 1)
	go func() {
		a, err := callErr(cs, "tickets_create_ticket", ticketArgs, meta)
		if err != nil {
			a.text = err.Error()
		}
		got <- a
	}()
	return got
}

// checkOutput refuses an answer as the official TypeScript and Python
// clients do: a tool that lists an output schema must answer structured
// content that fits it, unless the answer is an error (and TypeScript
// checks an error's structured content too).
func checkOutput(cs *mcp.ClientSession, name string, res *mcp.CallToolResult) error {
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		return err
	}
	for _, t := range tools.Tools {
		if t.Name != name || t.OutputSchema == nil {
			continue
		}
		var s jsonschema.Schema
		if b, err := json.Marshal(t.OutputSchema); err != nil || json.Unmarshal(b, &s) != nil {
			return fmt.Errorf("%s: its output schema does not decode", name)
		}
		rs, err := s.Resolve(nil)
		if err != nil {
			return err
		}
		switch {
		case res.StructuredContent == nil && !res.IsError:
			return fmt.Errorf("%s has an output schema but did not return structured content: %s", name, read(res))
		case res.StructuredContent != nil:
			if err := rs.Validate(res.StructuredContent); err != nil {
				return fmt.Errorf("%s: structured content does not match the tool's output schema (%v): %s", name, err, read(res))
			}
		}
	}
	return nil
}

func read(res *mcp.CallToolResult) answer {
	a := answer{isError: res.IsError}
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			a.text += tc.Text
		}
	}
	if m, ok := res.StructuredContent.(map[string]any); ok {
		a.ticket, _ = m["id"].(string)
	}
	a.ledger, _ = res.Meta[mcpgateway.MetaLedger].(map[string]any)
	return a
}

// concurrently runs f n times at once and returns the answers in order.
func concurrently(n int, f func(i int) answer) []answer {
	out := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = f(i)
		}()
	}
	wg.Wait()
	return out
}

// key returns an operation id no other test uses.
func key(t *testing.T, name string) string {
	return t.Name() + ":" + name + ":" + client.NewHolder()[2:10]
}

// apiKeys makes credentials with a key of scope for each tenant.
func apiKeys(t *testing.T, scope string, tenants ...string) (*server.Credentials, map[string]string) {
	t.Helper()
	keys := map[string]string{}
	var doc strings.Builder
	doc.WriteString("keys:\n")
	for _, tenant := range tenants {
		k, hash, err := server.NewAPIKey(tenant + "-agent")
		if err != nil {
			t.Fatal(err)
		}
		keys[tenant] = k
		fmt.Fprintf(&doc, "  - {id: %s-agent, tenant: %s, scopes: [%s], secret_sha256: %s}\n", tenant, tenant, scope, hash)
	}
	creds, err := server.ParseCredentials([]byte(doc.String()))
	if err != nil {
		t.Fatal(err)
	}
	return creds, keys
}

// jsonString is v as JSON, for messages.
func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
