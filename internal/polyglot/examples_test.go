package polyglot

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/opledger/ledger/internal/mdtable"
)

// systemPython is Debian's interpreter, whose python3-grpcio and
// python3-protobuf the Python example uses (not a pyenv or venv python3
// that may come first on PATH).
const systemPython = "/usr/bin/python3"

// TestPythonExample runs examples/python/demo.py (over clients/python):
// Reserve, Complete, a replayed retry, a refused conflict with its ErrorInfo,
// Lookup.
func TestPythonExample(t *testing.T) {
	t.Parallel()
	probe := exec.Command(systemPython, "-s", "-c", "import grpc, google.protobuf")
	probe.Env = cleanEnv()
	need(t, probe.Run() == nil, "%s cannot import grpc and google.protobuf (Debian: python3-grpcio, python3-protobuf)", systemPython)
	addr := startLedgerd(t)
	runClient(t, "PASS: python example", systemPython, "-s", "examples/python/demo.py", addr)
}

// TestNodeExample runs examples/node/demo.js (@grpc/grpc-js and
// @grpc/proto-loader): the same scenario as the Python example.
func TestNodeExample(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	need(t, err == nil, "node is not on PATH")
	_, err = os.Stat(filepath.Join(repoRoot(t), "examples", "node", "node_modules", "@grpc", "grpc-js"))
	need(t, err == nil, "examples/node/node_modules is not installed (npm ci --prefix examples/node)")
	addr := startLedgerd(t)
	buildTypeScript(t)
	runClient(t, "PASS: node example", node, "examples/node/demo.js", addr)
}

// faultsPolicy is the policy of the ledgerd the fault scenarios run against:
// a tool whose lease ends while it runs, unless it is renewed, and one with
// two attempts.
const faultsPolicy = `tools:
  - match: "tickets.slow"
    effect: irreversible
    lease: 2s
  - match: "tickets.flaky"
    max_attempts: 2
`

// startFaultsLedgerd runs a ledgerd with faultsPolicy.
func startFaultsLedgerd(t *testing.T) string {
	t.Helper()
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(faultsPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	return startLedgerd(t, "--policy", policy)
}

// TestExamplesShowFaultsPolicy: the READMEs of the Python and Node examples
// show the policy that the ledgerd their fault scenarios run against needs
// (faultsPolicy, which TestNodeFaults and TestPythonFaults start it with),
// so that a reader who runs faults.py or faults.js by hand runs them as this
// test does, not against the defaults, under which some scenarios fail.
func TestExamplesShowFaultsPolicy(t *testing.T) {
	for _, name := range []string{"examples/python/README.md", "examples/node/README.md"} {
		d, err := mdtable.Read(name)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, b := range d.All().CodeBlocks() {
			found = found || b.Info == "yaml" && b.Text == faultsPolicy
		}
		if !found {
			t.Errorf("%s: no yaml block with the policy the fault scenarios need, as internal/polyglot starts ledgerd with it:\n%s", name, faultsPolicy)
		}
	}
}

// TestNodeFaults runs examples/node/faults.js: outcomes the ledger could not
// record, a report the ledger asks to back off from, a Reserve refused for the
// tenant's unresolved limit and parameters over gRPC's size limit (both
// refused once, not repeated), parameters and results JSON cannot carry,
// results the ledger refuses (both results left UNKNOWN at once), final
// failures without a code or whose code the ledger refuses (recorded under
// tool_failed), a tool that outlives its lease, a reconciler's finding
// refused as already resolved because the worker's own report came first
// (the record read after it stands, and is replayed), a tool that hangs past
// its tool timeout, a Reserve whose answers are lost (the claim granted is
// returned), a wait on another caller's claim (backing off, on an injected
// clock), a claim that comes after the wait budget (returned unused), a caller
// that cancels while it waits, while its Reserve is on its way and while the
// tool runs, a Reserve answer that comes within its lease's margin and
// renewals that hang; each counting the effects at a fake destination.
func TestNodeFaults(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	need(t, err == nil, "node is not on PATH")
	_, err = os.Stat(filepath.Join(repoRoot(t), "examples", "node", "node_modules", "@grpc", "grpc-js"))
	need(t, err == nil, "examples/node/node_modules is not installed (npm ci --prefix examples/node)")
	buildTypeScript(t)
	runClient(t, "PASS: node faults", node, "examples/node/faults.js", startFaultsLedgerd(t))
}

// TestPythonFaults runs examples/python/faults.py: the scenarios of
// TestNodeFaults that apply to Python.
func TestPythonFaults(t *testing.T) {
	t.Parallel()
	probe := exec.Command(systemPython, "-s", "-c", "import grpc, google.protobuf")
	probe.Env = cleanEnv()
	need(t, probe.Run() == nil, "%s cannot import grpc and google.protobuf (Debian: python3-grpcio, python3-protobuf)", systemPython)
	runClient(t, "PASS: python faults", systemPython, "-s", "examples/python/faults.py", startFaultsLedgerd(t))
}
