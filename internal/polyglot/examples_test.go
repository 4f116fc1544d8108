package polyglot

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// systemPython is Debian's interpreter, whose python3-grpcio and
// python3-protobuf the Python example uses (not a pyenv or venv python3
// that may come first on PATH).
const systemPython = "/usr/bin/python3"

// TestPythonExample runs examples/python/demo.py (stubs from gen/python):
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
	runClient(t, "PASS: node example", node, "examples/node/demo.js", addr)
}
