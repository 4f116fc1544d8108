package polyglot

import (
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestLaunchLedgerdThatExits: a ledgerd that exits before it serves (here
// its policy file does not exist) makes launchLedgerd return an error with
// ledgerd's log, not wait for ever.
func TestLaunchLedgerdThatExits(t *testing.T) {
	t.Parallel()
	bin := ledgertest.LedgerdBinary(t, tmpDir)
	missing := filepath.Join(t.TempDir(), "no-such-policy.yaml")
	type result struct {
		d   *ledgerdProcess
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := launchLedgerd(bin, "127.0.0.1:0", "--policy", missing)
		done <- result{d, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			_ = r.d.stop()
			t.Fatalf("launchLedgerd with --policy %s served", missing)
		}
		if !strings.Contains(r.err.Error(), "exited") || !strings.Contains(r.err.Error(), "no-such-policy.yaml") {
			t.Fatalf("launchLedgerd's error does not say ledgerd exited, with its log: %v", r.err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("launchLedgerd still waits 2 minutes after starting a ledgerd that exits at once (--policy names no file)")
	}
}

// TestLaunchLedgerdOnPortZero: ledgerd binds the port it is given as
// 127.0.0.1:0 itself, and launchLedgerd returns the address it bound (from
// its log), serving: no other process can take that port between its choice
// and the bind, nor answer in its place.
func TestLaunchLedgerdOnPortZero(t *testing.T) {
	t.Parallel()
	d, err := launchLedgerd(ledgertest.LedgerdBinary(t, tmpDir), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.stop(); err != nil {
			t.Error(err)
		}
	})
	if d.addr == "127.0.0.1:0" || !strings.HasPrefix(d.addr, "127.0.0.1:") {
		t.Fatalf("launchLedgerd returned %q, not the address ledgerd bound", d.addr)
	}
	if err := ledgertest.WaitServing(d.addr, d.exited, 30*time.Second); err != nil {
		t.Fatalf("%s: %v", d.addr, err)
	}
}

// TestPythonFaultsStoppedAtItsBound: the Python fault scenarios, stopped at
// their time bound (here against a ledger that never answers, so every call
// waits for its deadline), fail the run saying so, with what they printed
// until then and where every Python thread stood.
func TestPythonFaultsStoppedAtItsBound(t *testing.T) {
	t.Parallel()
	probe := exec.Command(systemPython, "-s", "-c", "import grpc, google.protobuf")
	probe.Env = cleanEnv()
	need(t, probe.Run() == nil, "%s cannot import grpc and google.protobuf (Debian: python3-grpcio, python3-protobuf)", systemPython)
	silent, err := net.Listen("tcp", "127.0.0.1:0") // connections wait in its backlog, unanswered
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = silent.Close() })
	out, _, err := runExample(repoRoot(t), 10*time.Second, systemPython, "-s", "examples/python/faults.py", silent.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "did not finish within 10s") {
		t.Fatalf("faults.py against a ledger that never answers: %v, want an error saying it did not finish\n%s", err, out)
	}
	for _, want := range []string{"1. the tool ran", `faults.py", line`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the output of faults.py, stopped at its bound, has no %q:\n%s", want, out)
		}
	}
}
