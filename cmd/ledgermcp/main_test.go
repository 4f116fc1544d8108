package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
	"github.com/opledger/ledger/mcpgateway"
	"github.com/opledger/ledger/mcpgateway/mcptest"
)

var binDir string

func TestMain(m *testing.M) {
	mcptest.ServeStdioIfAsked()
	dir, err := os.MkdirTemp("", "ledgermcp-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := redistest.Run(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// TestUsage: bad usage exits 2 with a line saying what is wrong; -h
// exits 0; a key of the gateway's own that the ledger refuses exits 1 at
// start.
func TestUsage(t *testing.T) {
	good := writeConfig(t, "upstreams:\n  - {name: t, command: [x]}\n")
	_, creds := servicetest.Keys(t, "acme", "acme")
	secured := servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{Credentials: creds}).Addr
	t.Setenv("LEDGERMCP_TEST_KEY", "acme-agent.made-up")
	refused := writeConfig(t, "ledger: {api_key_env: LEDGERMCP_TEST_KEY}\nupstreams:\n  - {name: t, command: [x]}\n")
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"-h"}, 0, "usage: ledgermcp --config FILE"},
		{nil, 2, "--config FILE is required"},
		{[]string{"--config", good, "stray"}, 2, "unexpected arguments: [stray]: ledgermcp takes flags only (ledgermcp -h lists them)"},
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"--config", good, "--log-level", "loud"}, 2, "--log-level"},
		{[]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")}, 2, "no such file"},
		{[]string{"--config", writeConfig(t, "upstreams: []\n")}, 2, "at least one is needed"},
		{[]string{"--config", good, "--http", "0.0.0.0:8931"}, 2, "need tls"},
		{[]string{"--config", good, "--metrics-listen", "9465"}, 2, "want HOST:PORT"},
		{[]string{"--config", refused, "--ledger", secured}, 1, "ledger.api_key_env: the ledger refuses the key in LEDGERMCP_TEST_KEY"},
	} {
		var stderr bytes.Buffer
		if code := run(context.Background(), tc.args, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.says) {
			t.Errorf("ledgermcp %q = %d, %q; want %d saying %q", tc.args, code, stderr.String(), tc.code, tc.says)
		}
	}
}

func writeConfig(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// ledger starts a ledger service for the test, with a 1s lease.
func ledger(t *testing.T) *servicetest.Stack {
	return servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{
		Policy: "tools:\n  - match: \"*\"\n    lease: 1s\n", Prefix: "mcp-" + client.NewHolder()[2:14]})
}

// TestStdio: an MCP client starts the ledgermcp binary as its stdio
// server, as a desktop agent does; the gateway starts its own stdio
// upstream. One operation sent twice is applied once; a read-only tool
// is forwarded each time; /metrics counts each outcome, under the tenant
// of the gateway's key with --metrics-tenant-label (the ledger's default
// tenant: it runs without credentials).
func TestStdio(t *testing.T) {
	st := ledger(t)
	up := mcptest.New(t.TempDir())
	cfg := writeConfig(t, fmt.Sprintf("ledger: {address: %q}\nupstreams:\n  - name: tickets\n    command: [%q]\n    env: {%s: %q}\n",
		st.Addr, os.Args[0], mcptest.StdioEnv, up.Dir))
	cmd := exec.Command(ledgertest.LedgermcpBinary(t, binDir), "--config", cfg, "--metrics-listen", "127.0.0.1:0", "--metrics-tenant-label")
	logs := &ledgertest.Buffer{}
	cmd.Stderr = logs
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	meta := mcp.Meta{mcpgateway.MetaIdempotencyKey: "stdio-" + client.NewHolder()}
	var tickets []string
	for range 2 {
		res := callTool(t, cs, "tickets_create_ticket", meta)
		tickets = append(tickets, ticket(res))
		callTool(t, cs, "tickets_search_tickets", nil)
	}
	if up.Count("create_ticket") != 1 || tickets[0] != "T-1" || tickets[1] != "T-1" || up.Calls("search_tickets") != 2 {
		t.Fatalf("tickets %v, %d effects, %d searches; want T-1 twice from one effect, two searches", tickets, up.Count("create_ticket"), up.Calls("search_tickets"))
	}
	text := scrapeMetrics(t, logs)
	for _, want := range []string{
		`ledgermcp_calls_total{outcome="executed",tenant="default",tool="tickets_create_ticket"} 1`,
		`ledgermcp_calls_total{outcome="replayed",tenant="default",tool="tickets_create_ticket"} 1`,
		`ledgermcp_calls_total{outcome="unrecorded",tenant="default",tool="tickets_search_tickets"} 2`,
		`ledgermcp_upstream_connected{upstream="tickets"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, text)
		}
	}
}

// scrapeMetrics reads /metrics from the address the gateway logged.
func scrapeMetrics(t *testing.T, logs *ledgertest.Buffer) string {
	t.Helper()
	m := regexp.MustCompile(`"msg":"metrics serving","listen":"([^"]+)"`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no metrics listener in the log:\n%s", logs.String())
	}
	res, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func callTool(t *testing.T, cs *mcp.ClientSession, name string, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	res, err := callErr(cs, name, meta)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// callErr calls name with a copy of meta, which the SDK writes to.
func callErr(cs *mcp.ClientSession, name string, meta mcp.Meta) (*mcp.CallToolResult, error) {
	m := mcp.Meta{}
	for k, v := range meta {
		m[k] = v
	}
	return cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: map[string]any{"title": "Printer on fire"}, Meta: m})
}

func ticket(res *mcp.CallToolResult) string {
	m, _ := res.StructuredContent.(map[string]any)
	s, _ := m["id"].(string)
	return s
}

func outcome(res *mcp.CallToolResult) string {
	m, _ := res.Meta[mcpgateway.MetaLedger].(map[string]any)
	s, _ := m["outcome"].(string)
	return s
}

// TestKilledMidCall: the gateway is killed (SIGKILL) while the upstream,
// which applied the effect, has not answered yet. The operation's lease
// ends and it is UNKNOWN; the restarted gateway's probe finds the effect,
// and the next call gets the original result, applied once. Without a
// probe the operation stays UNKNOWN, and the next call says so.
func TestKilledMidCall(t *testing.T) {
	for _, probe := range []bool{true, false} {
		t.Run(fmt.Sprintf("probe=%v", probe), func(t *testing.T) {
			t.Parallel()
			st := ledger(t)
			up := mcptest.New(t.TempDir())
			srv := httptest.NewServer(up.Handler())
			t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() }) // after the gateways stop
			rules := ""
			if probe {
				rules = "\n    tools:\n      - {match: create_ticket, probe: {tool: find_ticket, not_found_after: 1s}}"
			}
			cfg := writeConfig(t, fmt.Sprintf("ledger: {address: %q}\nhttp: {anonymous: true}\nreconcile: {interval: 200ms}\nupstreams:\n  - name: tickets\n    url: %s%s\n",
				st.Addr, srv.URL, rules))
			k := "killed-" + client.NewHolder()
			meta := mcp.Meta{mcpgateway.MetaIdempotencyKey: k}

			gw := startHTTP(t, cfg)
			cs := dialHTTP(t, gw.url)
			up.Fault("create_ticket", "drop")
			go func() { _, _ = callErr(cs, "tickets_create_ticket", meta) }()
			for deadline := time.Now().Add(10 * time.Second); up.Count("create_ticket") == 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the upstream never applied the effect")
				}
			}
			gw.stop(syscall.SIGKILL)

			lc, err := client.Dial(st.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer lc.Close()
			waitState(t, lc, k, client.StateUnknown)
			url := startHTTP(t, cfg).url
			want := client.StateUnknown
			if probe {
				want = client.StateSucceeded
			}
			waitState(t, lc, k, want)
			if !probe {
				time.Sleep(time.Second) // a few background passes
				if o, err := lc.Lookup(context.Background(), k); err != nil || o.State != client.StateUnknown {
					t.Fatalf("without a probe: %+v, %v; want UNKNOWN", o, err)
				}
			}
			res := callTool(t, dialHTTP(t, url), "tickets_create_ticket", meta)
			switch {
			case probe && (res.IsError || ticket(res) != "T-1" || outcome(res) != "replayed"):
				t.Fatalf("the call after the restart = %+v, want the replay of T-1", res)
			case !probe && (!res.IsError || outcome(res) != "unknown"):
				t.Fatalf("the call after the restart = %+v, want unknown", res)
			}
			if n := up.Count("create_ticket"); n != 1 {
				t.Fatalf("%d effects, want 1", n)
			}
		})
	}
}

// TestStoppedMidCall: SIGTERM (or SIGHUP) while a call is in flight lets
// it end: the caller gets its answer and the ledger its outcome, applied
// once. A second signal ends the process at once, before the slow
// upstream applies anything.
func TestStoppedMidCall(t *testing.T) {
	for _, c := range []struct {
		name    string
		sig     syscall.Signal
		fault   string
		signals int
		effects int
		state   client.State
	}{
		{"SIGTERM", syscall.SIGTERM, "slow:2s", 1, 1, client.StateSucceeded},
		{"SIGHUP", syscall.SIGHUP, "slow:2s", 1, 1, client.StateSucceeded},
		{"SIGTERM twice", syscall.SIGTERM, "slow:60s", 2, 0, client.StateRunning},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st := ledger(t)
			up := mcptest.New(t.TempDir())
			srv := httptest.NewServer(up.Handler())
			t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
			cfg := writeConfig(t, fmt.Sprintf("ledger: {address: %q}\nhttp: {anonymous: true}\nupstreams:\n  - name: tickets\n    url: %s\n", st.Addr, srv.URL))
			k := "stopped-" + client.NewHolder()
			gw := startHTTP(t, cfg)
			cs := dialHTTP(t, gw.url)
			up.Fault("create_ticket", c.fault)
			answered := make(chan *mcp.CallToolResult, 1)
			go func() {
				res, _ := callErr(cs, "tickets_create_ticket", mcp.Meta{mcpgateway.MetaIdempotencyKey: k})
				answered <- res
			}()
			ledgertest.Await(t, "the upstream gets the call", func() bool { return up.Calls("create_ticket") > 0 })
			_ = gw.cmd.Process.Signal(c.sig)
			ledgertest.Await(t, "the log line \"waiting for the requests in flight to end\"", func() bool { return strings.Contains(gw.log.String(), "waiting for the requests in flight to end") })
			if c.signals == 2 {
				gw.stop(c.sig)
			}
			<-gw.exited
			res := <-answered
			if n := up.Count("create_ticket"); n != c.effects {
				t.Fatalf("%d effects when the gateway exited, want %d", n, c.effects)
			}
			if c.effects == 1 && (res == nil || res.IsError || ticket(res) != "T-1" || outcome(res) != "executed") {
				t.Fatalf("the call in flight at SIGTERM = %+v, want executed T-1", res)
			}
			lc, err := client.Dial(st.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer lc.Close()
			if o, err := lc.Lookup(context.Background(), k); err != nil || o.State != c.state {
				t.Fatalf("operation = %+v, %v; want %v", o, err, c.state)
			}
		})
	}
}

// TestStoppedMidCallOverStdio: SIGTERM to a gateway serving stdio while a
// call is in flight: the call ends, is recorded and answered, then the
// process exits; a call sent meanwhile is refused and runs nothing; the
// same call sent to the next gateway replays it.
func TestStoppedMidCallOverStdio(t *testing.T) {
	st := ledger(t)
	up := mcptest.New(t.TempDir())
	srv := httptest.NewServer(up.Handler())
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	cfg := writeConfig(t, fmt.Sprintf("ledger: {address: %q}\nupstreams:\n  - name: tickets\n    url: %s\n", st.Addr, srv.URL))
	meta := mcp.Meta{mcpgateway.MetaIdempotencyKey: "stopped-" + client.NewHolder()}
	stdio := func() (*mcp.ClientSession, *exec.Cmd, *ledgertest.Buffer) {
		cmd := exec.Command(ledgertest.LedgermcpBinary(t, binDir), "--config", cfg)
		logs := &ledgertest.Buffer{}
		cmd.Stderr = logs
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs, cmd, logs
	}
	cs, cmd, logs := stdio()
	up.Fault("create_ticket", "slow:2s")
	answered := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := callErr(cs, "tickets_create_ticket", meta)
		answered <- res
	}()
	ledgertest.Await(t, "the upstream gets the call", func() bool { return up.Calls("create_ticket") > 0 })
	_ = cmd.Process.Signal(syscall.SIGTERM)
	ledgertest.Await(t, "the log line \"stopping: new tool calls are refused\"", func() bool { return strings.Contains(logs.String(), "stopping: new tool calls are refused") })
	late := callTool(t, cs, "tickets_create_ticket", mcp.Meta{mcpgateway.MetaIdempotencyKey: "late-" + client.NewHolder()})
	if !late.IsError || outcome(late) != "unavailable" {
		t.Fatalf("a call while the gateway stops = %+v, want unavailable", late)
	}
	if res := <-answered; res == nil || res.IsError || ticket(res) != "T-1" || outcome(res) != "executed" {
		t.Fatalf("the call in flight at SIGTERM = %+v, want executed T-1", res)
	}
	next, _, _ := stdio()
	if res := callTool(t, next, "tickets_create_ticket", meta); res.IsError || ticket(res) != "T-1" || outcome(res) != "replayed" {
		t.Fatalf("the same call after the SIGTERM = %+v, want the replay of T-1", res)
	}
	if n, calls := up.Count("create_ticket"), up.Calls("create_ticket"); n != 1 || calls != 1 {
		t.Fatalf("%d effects of %d calls upstream, want 1 of 1", n, calls)
	}
}

// TestIdleTimeout: the MCP listener and the metrics listener close a
// connection left idle.
func TestIdleTimeout(t *testing.T) {
	defer func(d time.Duration) { idleTimeout = d }(idleTimeout)
	idleTimeout = 300 * time.Millisecond
	logs := runHTTP(t, "", "--metrics-listen", "127.0.0.1:0")
	for _, l := range []struct{ msg, path string }{{"ledgermcp serving", mcpgateway.HealthPath}, {"metrics serving", "/metrics"}} {
		addr, err := ledgertest.ListenAddr(logs.String, l.msg, nil, 20*time.Second)
		if err != nil {
			t.Fatalf("%v\n%s", err, logs)
		}
		if err := ledgertest.IdleClosed(addr, l.path); err != nil {
			t.Errorf("%s: %v", l.msg, err)
		}
	}
}

// TestMaxConnections: while the listener holds http.max_connections
// connections, one more waits, and is served once one of them closes.
func TestMaxConnections(t *testing.T) {
	logs := runHTTP(t, "max_connections: 2")
	addr, err := ledgertest.ListenAddr(logs.String, "ledgermcp serving", nil, 20*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	answered := make(chan error, 1)
	go func() {
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
		resp, err := c.Get("http://" + addr + mcpgateway.HealthPath)
		if err == nil {
			_ = resp.Body.Close()
		}
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("a third connection was served while two were held (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	_ = held[0].Close()
	if err := <-answered; err != nil {
		t.Fatalf("the third connection, once one closed: %v", err)
	}
}

// runHTTP runs the gateway in this process, serving Streamable HTTP on a
// free loopback port, with more YAML fields under http and more args, and
// stops it when the test ends. Its ledger and upstream cannot be reached.
func runHTTP(t *testing.T, fields string, args ...string) *ledgertest.Buffer {
	t.Helper()
	cfg := writeConfig(t, fmt.Sprintf("ledger: {address: %q}\nhttp: {anonymous: true, %s}\nupstreams:\n  - {name: t, command: [%q]}\n",
		ledgertest.ClosedAddr(t), fields, filepath.Join(t.TempDir(), "no-such-server")))
	ctx, cancel := context.WithCancel(context.Background())
	logs, exited := &ledgertest.Buffer{}, make(chan struct{})
	go func() {
		defer close(exited)
		run(ctx, append([]string{"--config", cfg, "--http", "127.0.0.1:0"}, args...), logs)
	}()
	t.Cleanup(func() { cancel(); <-exited })
	return logs
}

// gateway is a ledgermcp process serving Streamable HTTP.
type gateway struct {
	cmd    *exec.Cmd
	log    *ledgertest.Buffer
	exited chan struct{}
	url    string
}

// stop signals the process and waits for it to exit.
func (g *gateway) stop(sig os.Signal) {
	_ = g.cmd.Process.Signal(sig)
	<-g.exited
}

// startHTTP runs the ledgermcp binary on a free loopback port, stopped
// when the test ends.
func startHTTP(t *testing.T, cfg string) *gateway {
	t.Helper()
	g := &gateway{log: &ledgertest.Buffer{}, exited: make(chan struct{})}
	g.cmd = exec.Command(ledgertest.LedgermcpBinary(t, binDir), "--config", cfg, "--http", "127.0.0.1:0")
	g.cmd.Stderr = g.log
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.cmd.Wait(); close(g.exited) }()
	t.Cleanup(func() { g.stop(syscall.SIGTERM) })
	addr, err := ledgertest.ListenAddr(g.log.String, "ledgermcp serving", g.exited, 20*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, g.log.String())
	}
	g.url = "http://" + addr + "/mcp"
	return g
}

func dialHTTP(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: http.DefaultClient}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func waitState(t *testing.T, lc *client.Client, id string, want client.State) *client.Operation {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		o, err := lc.Lookup(context.Background(), id)
		if err == nil && o.State == want {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s = %+v, %v; want %v", id, o, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
