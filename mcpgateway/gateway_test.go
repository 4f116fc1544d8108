package mcpgateway_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/mcpgateway"
	"github.com/opledger/ledger/mcpgateway/mcptest"
	"github.com/opledger/ledger/server"
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

// TestLedgerOverTLS: the gateway reaches a ledger that serves TLS with
// ledger.tls: its CA from ca_file, and its client certificate from
// cert_file and key_file where the ledger maps certificates to tenants.
// The call runs once and replays. A ledger whose certificate another CA
// issued is not reached, and nothing is forwarded.
func TestLedgerOverTLS(t *testing.T) {
	dir := t.TempDir()
	pki := ledgertest.NewPKI(t, dir)
	serverCert, _, _ := pki.Issue(t, "ledger", "ledger", true)
	_, clientFile, clientKey := pki.Issue(t, "gateway", "gateway.acme.internal", false)
	other := ledgertest.NewPKI(t, t.TempDir())
	creds, err := server.ParseCredentials([]byte("clients:\n  - {common_name: gateway.acme.internal, tenant: acme, scopes: [reconciler]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	serverTLS := func(auth tls.ClientAuthType) *tls.Config {
		return &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pki.Pool, ClientAuth: auth, MinVersion: tls.VersionTLS12}
	}
	for _, tc := range []struct {
		name   string
		opts   rigOptions
		effect bool // else: refused as unavailable, not forwarded
	}{
		{"ca_file", rigOptions{ledgerTLS: serverTLS(tls.NoClientCert), ledgerYAML: "  tls: {ca_file: " + pki.CAFile + "}"}, true},
		{"client certificate", rigOptions{creds: creds, ledgerTLS: serverTLS(tls.RequireAndVerifyClientCert),
			ledgerYAML: fmt.Sprintf("  tls: {ca_file: %s, cert_file: %s, key_file: %s}", pki.CAFile, clientFile, clientKey)}, true},
		{"another CA", rigOptions{ledgerTLS: serverTLS(tls.NoClientCert), ledgerYAML: "  tls: {ca_file: " + other.CAFile + "}",
			rules: "- {match: create_ticket, wait: 2s}"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, tc.opts)
			cs := r.stdio(clientOptions{})
			meta := mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "op")}
			first := call(t, cs, "tickets_create_ticket", ticketArgs, meta)
			if !tc.effect {
				if !first.isError || first.outcome() != "unavailable" || r.up.Calls("create_ticket") != 0 {
					t.Fatalf("call = %v with %d forwards, want unavailable and none", first, r.up.Calls("create_ticket"))
				}
				return
			}
			second := call(t, cs, "tickets_create_ticket", ticketArgs, meta)
			if first.outcome() != "executed" || second.outcome() != "replayed" || second.ticket != first.ticket || r.up.Count("create_ticket") != 1 {
				t.Fatalf("calls = %v, %v with %d effects, want one executed and replayed", first, second, r.up.Count("create_ticket"))
			}
		})
	}
}

// TestLedgerTLSFiles: a TLS file the gateway cannot use stops New, naming
// ledger.tls and the file.
func TestLedgerTLSFiles(t *testing.T) {
	dir := t.TempDir()
	pki := ledgertest.NewPKI(t, dir)
	_, certFile, keyFile := pki.Issue(t, "gateway", "gateway", false)
	notPEM := pki.NotPEM
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		tls, want string
	}{
		{"{ca_file: " + missing + "}", "ledger.tls: open " + missing},
		{"{ca_file: " + notPEM + "}", "ledger.tls: " + notPEM + ": no PEM certificate in it"},
		{"{cert_file: " + certFile + ", key_file: " + missing + "}", "ledger.tls: open " + missing},
		{"{cert_file: " + keyFile + ", key_file: " + certFile + "}", "ledger.tls: tls: "},
	} {
		cfg, err := mcpgateway.ParseConfig([]byte("ledger:\n  tls: "+tc.tls+"\nupstreams:\n  - {name: tickets, url: \"http://127.0.0.1:1/mcp\"}\n"), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.tls, err)
		}
		if _, err := mcpgateway.New(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with ledger.tls %s = %v, want an error with %q", tc.tls, err, tc.want)
		}
	}
}

// TestOneNameOneUpstream: two upstreams whose tools come out under the
// same served name (tickets_ + create_ticket, t + ickets_create_ticket):
// the name is served once, the other is left out and the log says so, and
// calls reach one upstream only.
func TestOneNameOneUpstream(t *testing.T) {
	var other atomic.Int64
	srv := mcp.NewServer(&mcp.Implementation{Name: "other"}, nil)
	srv.AddTool(&mcp.Tool{Name: "ickets_create_ticket", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			other.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "other"}}}, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	r := newRig(t, rigOptions{upstreams: "  - {name: other, prefix: t, url: " + hs.URL + "}"})
	cs := r.http("", clientOptions{})
	if n := strings.Count(strings.Join(names(list(t, cs)), " "), "tickets_create_ticket"); n != 1 {
		t.Fatalf("tools %v: tickets_create_ticket served %d times", names(list(t, cs)), n)
	}
	for i := range 3 {
		call(t, cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, fmt.Sprint(i))})
	}
	if mine, theirs := r.up.Count("create_ticket"), other.Load(); mine+int(theirs) != 3 || mine != 0 && theirs != 0 {
		t.Fatalf("the tickets upstream applied %d, the other got %d calls: want all 3 at one of them", mine, theirs)
	}
	if !strings.Contains(r.log.String(), "another upstream's tool has its name") {
		t.Fatalf("the log does not say a tool was left out:\n%s", r.log.String())
	}
}

// TestRunIDFromEnvironment: a LEDGER_RUN_ID the ledger would refuse as a
// run id (every call would be refused for it) stops the gateway from
// starting, naming the variable and what is wrong.
func TestRunIDFromEnvironment(t *testing.T) {
	cfg, err := mcpgateway.ParseConfig([]byte("upstreams:\n  - {name: tickets, url: \"http://127.0.0.1:1/mcp\"}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, want string }{
		{"run-7", ""},
		{strings.Repeat("r", 257), "LEDGER_RUN_ID: invalid argument: run_id: longer than 256 bytes"},
		{"run-7\n", "LEDGER_RUN_ID: invalid argument: run_id: contains a control character"},
	} {
		t.Setenv(mcpgateway.RunIDEnv, tc.id)
		g, err := mcpgateway.New(cfg, slog.New(slog.DiscardHandler))
		if got := fmt.Sprint(err); (tc.want == "") != (err == nil) || err != nil && !strings.Contains(got, tc.want) {
			t.Errorf("%s=%q: %v, want %q", mcpgateway.RunIDEnv, tc.id, err, tc.want)
		}
		if g != nil {
			_ = g.Close()
		}
	}
}

// TestRulesThatApplyToNoTool: a rule whose match finds no tool (a typo),
// and one whose tools an earlier rule takes first, are logged when the
// upstream's tools are listed; a rule that takes a tool is not.
func TestRulesThatApplyToNoTool(t *testing.T) {
	r := newRig(t, rigOptions{rules: `
- {match: create_tikcet, effect: irreversible}
- {match: create_*, timeout: 10s}
- {match: create_ticket, timeout: 1s}`})
	// The rules are checked before the tools are served.
	if served := names(list(t, r.http("", clientOptions{}))); !slices.Contains(served, "tickets_create_ticket") {
		t.Fatalf("tools %v: tickets_create_ticket not served", served)
	}
	logs := r.log.String()
	for _, c := range []struct {
		line string
		want bool
	}{
		{"rule=0 match=create_tikcet", true},
		{"rule=1 ", false},
		{"rule=2 match=create_ticket", true},
	} {
		if got := strings.Contains(logs, "tool rule applies to no tool") && strings.Contains(logs, c.line); got != c.want {
			t.Errorf("%q logged: %v, want %v:\n%s", c.line, got, c.want, logs)
		}
	}
}

// TestCloseLetsCallsEnd: Close (the gateway's SIGTERM) waits for a call
// in flight, so that its outcome is recorded with the upstream and the
// ledger still there (SUCCEEDED, one effect), and returns only once its
// answer is written, here slowed by 300 ms. A request that comes after
// Close began is refused with 503, and runs nothing.
func TestCloseLetsCallsEnd(t *testing.T) {
	for _, upstream := range []string{"stdio", "http"} {
		t.Run(upstream, func(t *testing.T) {
			t.Parallel()
			closeMidCall(t, upstream)
		})
	}
}

func closeMidCall(t *testing.T, upstream string) {
	k := key(t, "in-flight")
	var written atomic.Bool // the call's answer has been written
	slow := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			h.ServeHTTP(&slowWriter{ResponseWriter: w, mark: k, written: &written}, req)
		})
	}
	r := newRig(t, rigOptions{upstream: upstream, rules: "- {match: create_ticket, timeout: 10s}", wrap: slow})
	cs := r.http("", clientOptions{})
	r.up.Fault("create_ticket", "slow:2s")
	got := callLater(cs, mcp.Meta{mcpgateway.MetaIdempotencyKey: k})
	ledgertest.Await(t, "the upstream gets the call", func() bool { return r.up.Calls("create_ticket") > 0 })
	closed := make(chan error, 1)
	go func() { closed <- r.gw.Close() }()
	ledgertest.Await(t, "the log line \"waiting for the requests in flight to end\"", func() bool { return strings.Contains(r.log.String(), "waiting for the requests in flight to end") })
	if late, err := callErr(cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "late")}); err == nil || !strings.Contains(err.Error(), "Service Unavailable") {
		t.Fatalf("a call after Close began = %v, %v; want 503 Service Unavailable", late, err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close = %v", err)
	}
	if !written.Load() {
		t.Fatal("Close returned before the answer of the call in flight was written")
	}
	if a := <-got; a.isError || a.outcome() != "executed" || a.ticket != "T-1" {
		t.Fatalf("the call in flight at Close = %v; want executed, T-1", a)
	}
	o, err := r.ledgerClient("").Lookup(context.Background(), k)
	if err != nil || o.State != client.StateSucceeded {
		t.Fatalf("the call in flight at Close = %+v, %v; want SUCCEEDED", o, err)
	}
	if n, calls := r.up.Count("create_ticket"), r.up.Calls("create_ticket"); n != 1 || calls != 1 {
		t.Fatalf("%d effects of %d calls upstream, want 1 of 1", n, calls)
	}
}

// slowWriter writes a body that holds mark 300 ms late, then notes it
// written.
type slowWriter struct {
	http.ResponseWriter
	mark    string
	written *atomic.Bool
}

func (w *slowWriter) Write(b []byte) (int, error) {
	if !strings.Contains(string(b), w.mark) {
		return w.ResponseWriter.Write(b)
	}
	time.Sleep(300 * time.Millisecond)
	n, err := w.ResponseWriter.Write(b)
	w.written.Store(true)
	return n, err
}

func (w *slowWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
