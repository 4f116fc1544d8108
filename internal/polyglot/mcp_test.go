package polyglot

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/mdtable"
	"github.com/opledger/ledger/mcpgateway"
)

// TestMCPExample runs the walkthrough of examples/mcp/README.md: a ledgerd,
// the ledgermcp binary with examples/mcp/gateway.yaml (which starts the
// demo ticket desk), and the Node client on the official MCP SDK over
// Streamable HTTP: a client that is not ours. Its output must be the one
// the README shows.
func TestMCPExample(t *testing.T) {
	node, err := exec.LookPath("node")
	need(t, err == nil, "node is not on PATH")
	root := repoRoot(t)
	_, err = os.Stat(filepath.Join(root, "examples", "mcp", "node", "node_modules", "@modelcontextprotocol", "sdk"))
	need(t, err == nil, "examples/mcp/node/node_modules is not installed (npm ci --prefix examples/mcp/node)")
	want := readmeOutput(t, "examples/mcp/README.md", "$ node examples/mcp/node/client.mjs")

	addr := startGateway(t, root, "--config", "examples/mcp/gateway.yaml", "--ledger", startLedgerd(t))
	all, out, err := runExample(root, 2*time.Minute, node, "examples/mcp/node/client.mjs", "http://"+addr+"/mcp")
	if err != nil {
		t.Fatalf("client.mjs: %v\n%s", err, all)
	}
	// The README shows what the client prints; warnings of Node's own on
	// stderr are not part of it.
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("client.mjs printed\n%s\nexamples/mcp/README.md shows\n%s\n(all of its output:\n%s)", got, want, all)
	}
}

// TestMCPAnswersInTheOfficialClient: operations of the demo desk's
// create_ticket, settled by an operator with data in the ticket's shape and
// with data of another shape, are replayed through the gateway to the Node
// client on the official SDK, which checks every answer against the tool's
// output schema: the first is the ticket, the second text saying the call
// succeeded; the client throws on neither.
func TestMCPAnswersInTheOfficialClient(t *testing.T) {
	node, root, sdk := mcpSDK(t)
	ledger := startLedgerd(t)
	addr := startGateway(t, root, "--config", "examples/mcp/gateway.yaml", "--ledger", ledger)
	c, err := client.Dial(ledger)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prefix := fmt.Sprintf("schema-%d:", os.Getpid())
	for key, data := range map[string]map[string]any{
		"shaped": {"id": "TCK-9", "title": "Printer on fire", "priority": 2},
		"other":  {"ticket": "TCK-9"},
	} {
		settled(t, c, prefix+key, data)
	}
	runClient(t, "PASS: schema answers", node, filepath.Join("internal", "polyglot", "testdata", "schema_answers.mjs"),
		"http://"+addr+"/mcp", sdk, prefix+"shaped", prefix+"other")
}

// settled leaves operation id of the gateway's create_ticket, for the
// arguments schema_answers.mjs sends, SUCCEEDED by an operator's finding
// with data, after an attempt whose outcome was lost.
func settled(t *testing.T, c *client.Client, id string, data map[string]any) {
	t.Helper()
	ctx := context.Background()
	op := client.Op{ID: id, Tool: "tickets_create_ticket", Params: map[string]any{"/title": "Printer on fire", "/priority": 2}}
	r, err := c.Reserve(ctx, op, "h-lost")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.MarkUnknown(ctx, id, r.Operation.FencingToken, "the answer was lost"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reconcile(ctx, id, client.Finding{Kind: client.Applied, Result: client.Result{ResourceID: "TCK-9", Data: data}, Note: "found by hand"}); err != nil {
		t.Fatal(err)
	}
}

// readmeOutput returns the output the README shows after the command line
// that starts with command.
func readmeOutput(t *testing.T, path, command string) string {
	t.Helper()
	doc, err := mdtable.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range doc.All().CodeBlocks() {
		if first, rest, ok := strings.Cut(b.Text, "\n"); ok && strings.HasPrefix(first, command) {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("%s shows no %q", path, command)
	return ""
}

// startGateway runs the ledgermcp binary in dir with args over Streamable
// HTTP on a loopback port until the test ends, waits until its upstreams'
// tools are served, and returns its address.
func startGateway(t *testing.T, dir string, args ...string) string {
	t.Helper()
	log := &ledgertest.Buffer{}
	cmd := exec.Command(ledgertest.LedgermcpBinary(t, tmpDir), append(args, "--http", "127.0.0.1:0")...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, cleanEnv(), log, log
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		if t.Failed() {
			t.Logf("ledgermcp log:\n%s", log.String())
		}
	})
	addr, err := ledgertest.ListenAddr(log.String, "ledgermcp serving", exited, time.Minute)
	if err != nil {
		t.Fatalf("ledgermcp: %v\n%s", err, log.String())
	}
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(log.String(), `"msg":"upstream tools served"`); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("ledgermcp served no upstream's tools:\n%s", log.String())
		}
	}
	return addr
}

// TestMCPNodeUpstream: the gateway in front of a tool server on the
// official TypeScript SDK (testdata/tickets_server.mjs), over stdio, and
// over Streamable HTTP with event streams, with JSON answers and without
// sessions. A call runs once and its repeat is replayed; a call whose
// answer never comes is found by the probe (find_ticket) and replayed;
// after the server restarts, its sessions lost, the next call runs on a
// new one, whether the server answers the old session 404 or 400. The
// server's file counts the effects.
func TestMCPNodeUpstream(t *testing.T) {
	node, root, sdk := mcpSDK(t)
	ledger := startLedgerd(t)
	for _, mode := range []string{"stdio", "http", "json", "stateless", "http-400"} {
		t.Run(mode, func(t *testing.T) {
			desk := nodeDesk{node: node, server: filepath.Join(root, "internal", "polyglot", "testdata", "tickets_server.mjs"), sdk: sdk,
				effects: filepath.Join(t.TempDir(), "effects"), mode: mode}
			up := "command: [" + strings.Join(quoted(desk.command("stdio")), ", ") + "]"
			if mode != "stdio" {
				up = "url: http://" + desk.start(t, "127.0.0.1:0") + "/mcp"
			}
			config := filepath.Join(t.TempDir(), "gateway.yaml")
			doc := "ledger: {address: " + ledger + "}\nhttp: {anonymous: true}\nreconcile: {interval: 200ms}\n" +
				"upstreams:\n  - name: tickets\n    " + up + "\n    tools:\n" +
				"      - {match: create_ticket, timeout: 2s, params: [/title], resource_id: /id, probe: {tool: find_ticket}}\n"
			if err := os.WriteFile(config, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			cs := connectMCP(t, "http://"+startGateway(t, root, "--config", config)+"/mcp")
			prefix := fmt.Sprintf("node-%s-%d:", mode, os.Getpid())
			ticket := func(key, title, want string) string {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "tickets_create_ticket", Arguments: map[string]any{"title": title},
					Meta: mcp.Meta{mcpgateway.MetaIdempotencyKey: prefix + key}})
				if err != nil {
					t.Fatalf("%s: %v", key, err)
				}
				got, _ := res.Meta[mcpgateway.MetaLedger].(map[string]any)
				id, _ := res.StructuredContent.(map[string]any)["id"].(string)
				if got["outcome"] != want || res.IsError || id == "" {
					t.Fatalf("%s: outcome %v, ticket %q, isError %v; want %s", key, got["outcome"], id, res.IsError, want)
				}
				return id
			}
			first := ticket("a", "Printer on fire", "executed")
			if again := ticket("a", "Printer on fire", "replayed"); again != first {
				t.Fatalf("the repeat replayed %s, want %s", again, first)
			}
			// The forward times out: the call's probe finds the ticket.
			found := ticket("b", "drop", "replayed")
			if again := ticket("b", "drop", "replayed"); again != found {
				t.Fatalf("the repeat replayed %s, want %s", again, found)
			}
			if mode != "stdio" {
				desk.restart(t)
			}
			last := ticket("c", "Paper jam", "executed")
			if n := desk.count(t); n != 3 || first == found || found == last {
				t.Fatalf("%d effects (tickets %s, %s, %s), want 3 different ones", n, first, found, last)
			}
		})
	}
}

// nodeDesk is testdata/tickets_server.mjs, served in mode, writing its
// effects to the file effects.
type nodeDesk struct {
	node, server, sdk, effects, mode string
	// cmd serves over HTTP on addr, until exited is closed.
	cmd    *exec.Cmd
	addr   string
	exited chan struct{}
}

// command is the server's command line, serving in mode.
func (d *nodeDesk) command(mode string) []string {
	return []string{d.node, d.server, d.sdk, d.effects, mode}
}

// start serves over HTTP on addr until the test ends, and returns the
// address it bound.
func (d *nodeDesk) start(t *testing.T, addr string) string {
	t.Helper()
	_, port, _ := strings.Cut(addr, ":")
	log := &ledgertest.Buffer{}
	args := append(d.command(d.mode), port)
	cmd, exited := exec.Command(args[0], args[1:]...), make(chan struct{})
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	d.cmd, d.exited = cmd, exited
	d.addr, _ = ledgertest.ListenAddr(log.String, "tickets serving", exited, time.Minute)
	if d.addr == "" {
		t.Fatalf("tickets_server.mjs never served:\n%s", log.String())
	}
	return d.addr
}

// restart kills the HTTP server and serves again on its address: the
// sessions it held are gone.
func (d *nodeDesk) restart(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Kill()
	<-d.exited
	d.start(t, d.addr)
}

// count returns how many effects the server applied.
func (d *nodeDesk) count(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(d.effects)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// connectMCP connects an MCP client on go-sdk to the Streamable HTTP
// endpoint url until the test ends.
func connectMCP(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "polyglot", Version: "1.0.0"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// quoted returns each of args as a quoted YAML string.
func quoted(args []string) []string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return q
}

// mcpSDK returns node's path, the repository's root and the directory of
// the official TypeScript MCP SDK that examples/mcp/node installs.
func mcpSDK(t *testing.T) (node, root, sdk string) {
	t.Helper()
	node, err := exec.LookPath("node")
	need(t, err == nil, "node is not on PATH")
	root = repoRoot(t)
	sdk = filepath.Join(root, "examples", "mcp", "node", "node_modules", "@modelcontextprotocol", "sdk")
	_, err = os.Stat(sdk)
	need(t, err == nil, "examples/mcp/node/node_modules is not installed (npm ci --prefix examples/mcp/node)")
	return node, root, sdk
}
