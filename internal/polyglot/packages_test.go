package polyglot

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/receipt"
)

// packagePolicy is the ledgerd policy the Python and TypeScript packages'
// tests run against (their fixtures name it): a short lease for short.*.
const packagePolicy = `tools:
  - match: "short.*"
    effect: irreversible
    lease: 400ms
`

// TestPythonPackage installs clients/python into a fresh virtual
// environment offline (pip install --no-build-isolation, Debian's
// packages only) and runs its pytest suite with the installed package
// against a ledgerd on a real redis-server.
func TestPythonPackage(t *testing.T) {
	probe := exec.Command(systemPython, "-s", "-c", "import grpc, google.protobuf, pytest, setuptools, venv")
	probe.Env = cleanEnv()
	need(t, probe.Run() == nil, "%s cannot import grpc, google.protobuf, pytest, setuptools and venv "+
		"(Debian: python3-grpcio, python3-protobuf, python3-pytest, python3-setuptools, python3-venv)", systemPython)
	root := repoRoot(t)
	dir := t.TempDir()
	// The source is copied, so that building it leaves nothing in the repository.
	src := filepath.Join(dir, "src")
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "clients", "python"), src).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v: %s", err, out)
	}
	venv := filepath.Join(dir, "venv")
	python := filepath.Join(venv, "bin", "python")
	for _, args := range [][]string{
		{systemPython, "-m", "venv", "--system-site-packages", venv},
		{python, "-m", "pip", "install", "--quiet", "--no-index", "--no-build-isolation", src},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = cleanEnv("PIP_DISABLE_PIP_VERSION_CHECK=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(packagePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startLedgerd(t, "--policy", policy, "--redis-url", "redis://"+redistest.Start(t).Addr+"/0", "--receipt-keys", receiptKey(t))
	// From the copy's tests directory: the package imported is the installed one.
	cmd := exec.Command(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
	cmd.Dir = src
	cmd.Env = cleanEnv("LEDGER_ADDR="+addr, "PYTHONDONTWRITEBYTECODE=1")
	timer := time.AfterFunc(3*time.Minute, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	if err != nil {
		t.Fatalf("pytest: %v", err)
	}
}

// TestTypeScriptPackage builds clients/typescript with tsc and runs its
// node --test suite (the client, and its adapters under the Vercel AI SDK,
// the OpenAI Agents SDK and LangGraph with fake models) against a ledgerd on
// a real redis-server. make test installs its packages (npm ci).
func TestTypeScriptPackage(t *testing.T) {
	node, err := exec.LookPath("node")
	need(t, err == nil, "node is not on PATH")
	dir := buildTypeScript(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(packagePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startLedgerd(t, "--policy", policy, "--redis-url", "redis://"+redistest.Start(t).Addr+"/0", "--receipt-keys", receiptKey(t))
	cmd := exec.Command(node, "--test", "test/ledger.test.js", "test/struct.test.js", "test/guard.test.js", "test/frameworks.test.mjs")
	cmd.Dir = dir
	cmd.Env = cleanEnv("LEDGER_ADDR=" + addr)
	timer := time.AfterFunc(3*time.Minute, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("node --test: %v", err)
	}
}

// packedApp is a TypeScript program that calls one tool twice through the
// installed package, and prints how often the tool ran and what each call
// answered.
const packedApp = `import { Ledger, ToolResult } from '@opledger/client';

const ledger = new Ledger(process.env.LEDGER_ADDR as string);
let effects = 0;
const refund = async (): Promise<ToolResult> => {
  effects += 1;
  return { resource_id: 're_1', data: { amount: 10 } };
};

async function main(): Promise<void> {
  const call = { operationId: 'packed:refund', tool: 'payments.refund', params: { amount: 10 } };
  const first = await ledger.callTool(call, refund);
  const again = await ledger.callTool(call, refund);
  console.log(JSON.stringify({ effects, replayed: [first.replayed, again.replayed], resourceId: again.resourceId }));
  ledger.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
`

// TestTypeScriptPackageInstalls packs clients/typescript (npm pack),
// installs the tarball into a fresh project (from npm's cache, which make
// test's npm ci fills), type-checks a program against the installed
// declarations, and runs it against a ledgerd on a real redis-server: the
// tool applies its effect once, and the second call replays it.
func TestTypeScriptPackageInstalls(t *testing.T) {
	node, err := exec.LookPath("node")
	need(t, err == nil, "node is not on PATH")
	npm, err := exec.LookPath("npm")
	need(t, err == nil, "npm is not on PATH")
	dir := buildTypeScript(t)
	app := t.TempDir()
	run := func(env []string, name string, args ...string) []byte {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = app, env
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("%s %v: %v\n%s%s", name, args, err, out, stderr)
		}
		return out
	}
	var packed []struct {
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(run(cleanEnv(), npm, "pack", "--json", "--pack-destination", app, dir), &packed); err != nil || len(packed) != 1 {
		t.Fatalf("npm pack: %v %v", packed, err)
	}
	files := map[string]string{"package.json": `{"name": "app", "version": "0.0.0", "private": true}`, "app.ts": packedApp}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(app, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run(cleanEnv(), npm, "install", "--prefer-offline", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error",
		filepath.Join(app, packed[0].Filename))
	run(cleanEnv(), filepath.Join(dir, "node_modules", ".bin", "tsc"), "--strict", "--module", "commonjs", "--target", "ES2022",
		"--types", "node", "--typeRoots", filepath.Join(dir, "node_modules", "@types"), "--outDir", "out", "app.ts")
	addr := startLedgerd(t, "--redis-url", "redis://"+redistest.Start(t).Addr+"/0")
	out := run(cleanEnv("LEDGER_ADDR="+addr), node, filepath.Join("out", "app.js"))
	if want := `{"effects":1,"replayed":[false,true],"resourceId":"re_1"}`; strings.TrimSpace(string(out)) != want {
		t.Fatalf("the installed package: %s, want %s", out, want)
	}
}

var (
	tsOnce sync.Once
	tsErr  error
)

// buildTypeScript builds clients/typescript (tsc, once per test process)
// and returns its directory: the TypeScript tests and the Node examples run
// the package's dist/. It skips or fails when its packages are not
// installed (make test: npm ci there).
func buildTypeScript(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "clients", "typescript")
	tsc := filepath.Join(dir, "node_modules", ".bin", "tsc")
	_, err := os.Stat(tsc)
	need(t, err == nil, "clients/typescript/node_modules is not installed (npm ci --prefix clients/typescript)")
	tsOnce.Do(func() {
		build := exec.Command(tsc, "-p", ".")
		build.Dir = dir
		if out, err := build.CombinedOutput(); err != nil {
			tsErr = fmt.Errorf("tsc: %v\n%s", err, out)
		}
	})
	if tsErr != nil {
		t.Fatal(tsErr)
	}
	return dir
}

// receiptKey writes a receipt signing key for a ledgerd of the test, and
// returns its file.
func receiptKey(t *testing.T) string {
	t.Helper()
	k, err := receipt.NewKey("packages")
	if err != nil {
		t.Fatal(err)
	}
	b, err := k.MarshalJWK()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "receipts.jwk")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
