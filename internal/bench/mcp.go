package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The MCP part: one tool called directly, and the same tool through a
// ledgermcp process in front of it, in the same rounds; the ratios are to
// the direct call of the round.

// mcpPreload is how many operations the replay run draws from.
const mcpPreload = 1000

// mcpPart measures the gateway against the ledgerd at ledgerAddr.
func (c *Config) mcpPart(ctx context.Context, rep *Report, ledgerAddr string) error {
	fmt.Fprintln(c.Log, "MCP gateway:")
	upURL, stopUp, err := startMCPUpstream()
	if err != nil {
		return err
	}
	defer stopUp()
	gw, err := c.startGateway(ledgerAddr, upURL)
	if err != nil {
		return err
	}
	defer gw.Stop()
	direct, err := mcpSessions(ctx, upURL, c.Concurrency)
	if err != nil {
		return err
	}
	defer closeAll(direct)
	through, err := mcpSessions(ctx, "http://"+gw.Addr+"/mcp", c.Concurrency)
	if err != nil {
		return err
	}
	defer closeAll(through)
	run := RunID()
	m := &cpuMeter{ledgerd: c.pids[0], redis: c.pids[1], gateway: gw.cmd.Process.Pid}
	if _, err := c.mcpRun(ctx, m, Spec{Name: "preload", Concurrency: c.Concurrency, Count: mcpPreload}, mcpKeyed(through, run+"p", "g_apply")); err != nil {
		return err
	}
	type phase struct {
		name string
		call func(round string) Call
	}
	phases := []phase{
		{"tool called directly", func(string) Call { return mcpDirect(direct) }},
		{"gateway: read-only, unrecorded", func(string) Call { return mcpRead(through) }},
		{"gateway: new operation (key in _meta)", func(r string) Call { return mcpKeyed(through, run+"k"+r, "g_apply") }},
		{"gateway: new operation (session mode)", func(r string) Call { return mcpSession(through, run+"s"+r) }},
		{"gateway: replay", func(string) Call { return mcpReplay(through, run+"p") }},
	}
	var tp, lat [][]*Result
	for round := range c.Rounds {
		r := strconv.Itoa(round)
		for i, p := range phases {
			for _, at := range []struct {
				out  *[][]*Result
				conc int
				d    time.Duration
			}{{&tp, c.Concurrency, c.LatencyDuration}, {&lat, 1, c.LatencyDuration}} {
				spec := Spec{Name: p.name, Concurrency: at.conc, Warmup: c.Warmup, Duration: at.d, RPCs: 1}
				res, err := c.mcpRun(ctx, m, spec, p.call(r+strconv.Itoa(at.conc)))
				if err != nil {
					return err
				}
				if len(*at.out) == i {
					*at.out = append(*at.out, nil)
				}
				(*at.out)[i] = append((*at.out)[i], res)
			}
		}
	}
	rep.MCP, rep.MCPLatency = summarize(tp), summarize(lat)
	return nil
}

func (c *Config) mcpRun(ctx context.Context, m *cpuMeter, spec Spec, call Call) (*Result, error) {
	fmt.Fprintf(c.Log, "  %s at concurrency %d ...\n", spec.Name, spec.Concurrency)
	*m = cpuMeter{ledgerd: m.ledgerd, redis: m.redis, gateway: m.gateway}
	spec.Window = m.window
	r := Drive(ctx, spec, call)
	r.CPU = m.perCall(r.Calls)
	if r.Errors > 0 {
		return r, fmt.Errorf("%s: %d of %d calls failed; the first: %v", spec.Name, r.Errors, r.Errors+r.Calls, r.FirstErr)
	}
	return r, ctx.Err()
}

// startMCPUpstream serves, on a loopback port in this process, a tool
// server with apply (no annotations: irreversible) and read (read-only),
// each answering a small result at once.
func startMCPUpstream() (string, func(), error) {
	s := mcp.NewServer(&mcp.Implementation{Name: "bench-tools", Version: "1"}, nil)
	schema := map[string]any{"type": "object"}
	answer := func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{
			Content:           []mcp.Content{&mcp.TextContent{Text: "done"}},
			StructuredContent: map[string]any{"id": "R-1", "args": json.RawMessage(req.Params.Arguments)},
		}, nil
	}
	s.AddTool(&mcp.Tool{Name: "apply", InputSchema: schema}, answer)
	s.AddTool(&mcp.Tool{Name: "read", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, answer)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	return "http://" + lis.Addr().String(), func() { _ = srv.Close() }, nil
}

// startGateway runs the ledgermcp binary in front of upstream, over
// Streamable HTTP on a loopback port, and waits until it serves the
// upstream's tools.
func (c *Config) startGateway(ledgerAddr, upstream string) (*Process, error) {
	dir := filepath.Join(c.Dir, "mcp")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "gateway.yaml")
	doc := fmt.Sprintf("ledger: {address: %q}\nhttp: {anonymous: true}\nupstreams:\n  - {name: g, url: %q}\n", ledgerAddr, upstream)
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		return nil, err
	}
	logFile := filepath.Join(dir, "ledgermcp.log")
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p := &Process{}
	args := []string{"--config", cfg, "--http", "127.0.0.1:0"}
	if err := p.start(c.placement, c.Ledgermcp, args, f); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if p.exited() {
			return nil, fmt.Errorf("ledgermcp exited; its log: %s", lastLines(logFile, 5))
		}
		if addr, ok := gatewayReady(logFile); ok {
			p.Addr = addr
			return p, nil
		}
	}
	p.Stop()
	return nil, fmt.Errorf("ledgermcp did not serve within 30s; its log: %s", lastLines(logFile, 5))
}

// gatewayReady reads ledgermcp's log: its address, once it serves and has
// its upstream's tools.
func gatewayReady(logFile string) (string, bool) {
	f, err := os.Open(logFile)
	if err != nil {
		return "", false
	}
	defer f.Close()
	addr, tools := "", false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l struct{ Msg, Listen string }
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch l.Msg {
		case "ledgermcp serving":
			addr = l.Listen
		case "upstream tools served":
			tools = true
		}
	}
	return addr, addr != "" && tools
}

// mcpSessions opens n MCP sessions to url (at most 8: the calls of a
// session go in parallel). They share one pool of connections, which
// keeps as many idle as the calls at once need, as MCP clients do: Go's
// default keeps 2 per host and dials again for the other calls.
func mcpSessions(ctx context.Context, url string, n int) ([]*mcp.ClientSession, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 100, 100
	hc := &http.Client{Transport: t}
	var out []*mcp.ClientSession
	for range min(n, 8) {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "ledgerbench", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
		if err != nil {
			closeAll(out)
			return nil, err
		}
		out = append(out, cs)
	}
	return out, nil
}

func closeAll(ss []*mcp.ClientSession) {
	for _, s := range ss {
		_ = s.Close()
	}
}

// mcpCall calls name on one of ss and fails on an error answer.
func mcpCall(ctx context.Context, ss []*mcp.ClientSession, seq int64, name string, args map[string]any, meta mcp.Meta) error {
	res, err := ss[seq%int64(len(ss))].CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args, Meta: meta})
	if err != nil {
		return err
	}
	if res.IsError {
		var texts []string
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				texts = append(texts, t.Text)
			}
		}
		return errors.New(strings.Join(texts, " "))
	}
	return nil
}

func mcpDirect(ss []*mcp.ClientSession) Call {
	return func(ctx context.Context, seq int64) error {
		return mcpCall(ctx, ss, seq, "apply", map[string]any{"n": seq}, nil)
	}
}

func mcpRead(ss []*mcp.ClientSession) Call {
	return func(ctx context.Context, seq int64) error {
		return mcpCall(ctx, ss, seq, "g_read", map[string]any{"n": seq}, nil)
	}
}

// mcpKeyed calls tool with a new operation id in _meta each time.
func mcpKeyed(ss []*mcp.ClientSession, prefix, tool string) Call {
	return func(ctx context.Context, seq int64) error {
		return mcpCall(ctx, ss, seq, tool, map[string]any{"n": seq}, mcp.Meta{"idempotencyKey": OperationID(prefix, seq)})
	}
}

// mcpSession calls with new arguments each time and no key: a new
// operation of the session mode (a lookup, then Reserve and Complete).
func mcpSession(ss []*mcp.ClientSession, prefix string) Call {
	return func(ctx context.Context, seq int64) error {
		return mcpCall(ctx, ss, seq, "g_apply", map[string]any{"n": seq, "run": prefix}, nil)
	}
}

// mcpReplay repeats the preloaded operations.
func mcpReplay(ss []*mcp.ClientSession, prefix string) Call {
	return func(ctx context.Context, seq int64) error {
		n := seq % mcpPreload
		return mcpCall(ctx, ss, seq, "g_apply", map[string]any{"n": n}, mcp.Meta{"idempotencyKey": OperationID(prefix, n)})
	}
}

func (c *Config) printMCP(rep *Report) {
	for _, part := range []struct {
		title string
		sums  []*Summary
	}{
		{fmt.Sprintf("at %d concurrent calls", c.Concurrency), rep.MCP},
		{"at concurrency 1", rep.MCPLatency},
	} {
		if len(part.sums) == 0 {
			continue
		}
		fmt.Fprintf(c.Out, "\nMCP gateway %s (%v windows; medians of %d rounds; ratios to the tool called directly in the same round):\n", part.title, c.LatencyDuration, c.Rounds)
		w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(w, "scenario\tcalls/s\tp50\tp99\tcalls/s ÷ direct\tp50 ÷ direct\tCPU µs/call: load+tool\tgateway\tledgerd\tredis\t")
		for _, s := range part.sums {
			fmt.Fprintf(w, "%s\t%.0f\t%s\t%s\t%.2f\t%.2f\t%s\t%s\t%s\t%s\t\n", s.Name, s.RPS, ms(s.P50), ms(s.P99), s.RatioRPS, s.RatioP50,
				us(s.CPU.Client), us(s.CPU.Gateway), us(s.CPU.Ledgerd), us(s.CPU.Redis))
		}
		_ = w.Flush()
	}
}
