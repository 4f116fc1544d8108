package polyglot

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/mdtable"
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
	node, err := exec.LookPath("node")
	need(t, err == nil, "node is not on PATH")
	root := repoRoot(t)
	sdk := filepath.Join(root, "examples", "mcp", "node", "node_modules", "@modelcontextprotocol", "sdk")
	_, err = os.Stat(sdk)
	need(t, err == nil, "examples/mcp/node/node_modules is not installed (npm ci --prefix examples/mcp/node)")
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
