package polyglot

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// connCountingProxy forwards every connection to upstream and counts them.
type connCountingProxy struct {
	ln    net.Listener
	conns atomic.Int64
}

// startConnCountingProxy runs a proxy to upstream until the test ends.
func startConnCountingProxy(t *testing.T, upstream string) *connCountingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connCountingProxy{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			p.conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer down.Close()
				up, err := net.Dial("tcp", upstream)
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{})
				go func() { _, _ = io.Copy(up, down); _ = up.Close(); close(done) }()
				_, _ = io.Copy(down, up)
				_ = down.Close()
				<-done
			}()
		}
	}()
	return p
}

// idleCloseNode and idleClosePython run two tool calls through the
// example's ledger client, a second apart, against a ledgerd that closes a
// connection after 100ms without calls: the second call must reconnect.
// Each tool counts its runs (the fake destination); the script prints PASS
// when each ran exactly once.
const (
	idleCloseNode = `
const { Ledger } = require('./clients/typescript/dist');
(async () => {
  const ledger = new Ledger(process.argv[process.argv.length - 1]);
  const applied = {};
  const base = 'node-idle-' + Date.now() + '-' + Math.random().toString(16).slice(2);
  const send = (id) => ledger.callTool({ operationId: id, tool: 'tickets.create', params: { to: 'x' } }, async () => {
    applied[id] = (applied[id] || 0) + 1;
    return { resource_id: 'r-' + id };
  });
  await send(base + ':1');
  await new Promise((r) => setTimeout(r, 1000));
  await send(base + ':2');
  ledger.close();
  if (applied[base + ':1'] !== 1 || applied[base + ':2'] !== 1) throw new Error('applied ' + JSON.stringify(applied));
  console.log('PASS: node idle close');
})().catch((e) => { console.error(e); process.exit(1); });
`
	idleClosePython = `
import sys, time, uuid
sys.path.insert(0, "clients/python/src")
from opledger import Ledger
ledger = Ledger(sys.argv[-1])
applied = {}
base = "py-idle-" + uuid.uuid4().hex[:12]
def send(i):
    def fn(attempt):
        applied[i] = applied.get(i, 0) + 1
        return {"resource_id": "r-" + i, "data": {}}
    ledger.call_tool(operation_id=i, tool="tickets.create", params={"to": "x"}, permit_id="", fn=fn)
send(base + ":1")
time.sleep(1)
send(base + ":2")
ledger.close()
if applied != {base + ":1": 1, base + ":2": 1}:
    sys.exit("applied %r" % applied)
print("PASS: python idle close")
`
)

// ageCloseNode and ageClosePython run tool calls through the example's
// ledger client, one every 50ms for 1.5s, against a ledgerd that sends
// GOAWAY to a connection after 200ms however busy it is: the calls after
// each GOAWAY go over a new connection. Each tool counts its runs (the fake
// destination); the script prints PASS when each ran exactly once.
const (
	ageCloseNode = `
const { Ledger } = require('./clients/typescript/dist');
(async () => {
  const ledger = new Ledger(process.argv[process.argv.length - 1]);
  const applied = {};
  const base = 'node-age-' + Date.now() + '-' + Math.random().toString(16).slice(2);
  const send = (id) => ledger.callTool({ operationId: id, tool: 'tickets.create', params: { to: 'x' } }, async () => {
    applied[id] = (applied[id] || 0) + 1;
    return { resource_id: 'r-' + id };
  });
  const end = Date.now() + 1500;
  let n = 0;
  for (; Date.now() < end; n++) {
    await send(base + ':' + n);
    await new Promise((r) => setTimeout(r, 50));
  }
  ledger.close();
  for (let i = 0; i < n; i++) {
    if (applied[base + ':' + i] !== 1) throw new Error('applied ' + JSON.stringify(applied));
  }
  if (Object.keys(applied).length !== n) throw new Error('applied ' + JSON.stringify(applied));
  console.log('PASS: node age close');
})().catch((e) => { console.error(e); process.exit(1); });
`
	ageClosePython = `
import sys, time, uuid
sys.path.insert(0, "clients/python/src")
from opledger import Ledger
ledger = Ledger(sys.argv[-1])
applied = {}
base = "py-age-" + uuid.uuid4().hex[:12]
def send(i):
    def fn(attempt):
        applied[i] = applied.get(i, 0) + 1
        return {"resource_id": "r-" + i, "data": {}}
    ledger.call_tool(operation_id=i, tool="tickets.create", params={"to": "x"}, permit_id="", fn=fn)
end = time.monotonic() + 1.5
n = 0
while time.monotonic() < end:
    send("%s:%d" % (base, n))
    n += 1
    time.sleep(0.05)
ledger.close()
if applied != {"%s:%d" % (base, i): 1 for i in range(n)}:
    sys.exit("applied %r" % applied)
print("PASS: python age close")
`
)

// exampleClient is how to run one example's client on a script.
type exampleClient struct {
	name string
	cmd  func(t *testing.T, script, addr string) (string, []string)
}

// exampleClients are the Node and Python examples' clients; each skips
// (or fails, with LEDGER_TEST_POLYGLOT=require) when its runtime or
// packages are missing.
var exampleClients = []exampleClient{
	{"node", func(t *testing.T, script, addr string) (string, []string) {
		node, err := exec.LookPath("node")
		need(t, err == nil, "node is not on PATH")
		_, err = os.Stat(filepath.Join(repoRoot(t), "examples", "node", "node_modules", "@grpc", "grpc-js"))
		need(t, err == nil, "examples/node/node_modules is not installed (npm ci --prefix examples/node)")
		buildTypeScript(t)
		return node, []string{"-e", script, addr}
	}},
	{"python", func(t *testing.T, script, addr string) (string, []string) {
		probe := exec.Command(systemPython, "-s", "-c", "import grpc, google.protobuf")
		probe.Env = cleanEnv()
		need(t, probe.Run() == nil, "%s cannot import grpc and google.protobuf (Debian: python3-grpcio, python3-protobuf)", systemPython)
		return systemPython, []string{"-s", "-c", script, addr}
	}},
}

// TestExamplesReconnectAfterIdleClose: the Node and Python examples'
// clients, whose connection ledgerd closed for being idle, reconnect on
// their next call, which runs its tool exactly once; and they run with a
// bound of one call at a time per connection.
func TestExamplesReconnectAfterIdleClose(t *testing.T) {
	t.Parallel()
	scripts := map[string]string{"node": idleCloseNode, "python": idleClosePython}
	for _, c := range exampleClients {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			proxy := startConnCountingProxy(t, startLedgerd(t, "--max-connection-idle", "100ms", "--max-concurrent-streams", "1"))
			name, args := c.cmd(t, scripts[c.name], proxy.ln.Addr().String())
			runClient(t, "PASS: "+c.name+" idle close", name, args...)
			if n := proxy.conns.Load(); n < 2 {
				t.Errorf("%d connection to ledgerd: the idle close did not happen, the test tested nothing", n)
			}
		})
	}
}

// TestExamplesReconnectAfterAgeClose: the Node and Python examples'
// clients, calling without pause while ledgerd sends GOAWAY to each of
// their connections after --max-connection-age, go on over new
// connections without an error, and each tool runs exactly once.
func TestExamplesReconnectAfterAgeClose(t *testing.T) {
	t.Parallel()
	scripts := map[string]string{"node": ageCloseNode, "python": ageClosePython}
	for _, c := range exampleClients {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			proxy := startConnCountingProxy(t, startLedgerd(t, "--max-connection-age", "200ms", "--max-connection-age-grace", "10s"))
			name, args := c.cmd(t, scripts[c.name], proxy.ln.Addr().String())
			runClient(t, "PASS: "+c.name+" age close", name, args...)
			if n := proxy.conns.Load(); n < 3 {
				t.Errorf("%d connections to ledgerd: the age closes did not happen, the test tested nothing", n)
			}
		})
	}
}
