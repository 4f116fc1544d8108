package polyglot

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
)

var tmpDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ledger-polyglot-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tmpDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// repoRoot is the module root: the tests run in internal/polyglot.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// required reports whether a missing tool fails the test (make test) rather
// than skipping it (a plain go test).
func required() bool { return os.Getenv("LEDGER_TEST_POLYGLOT") == "require" }

// need skips or fails the test when a tool it needs is missing.
func need(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if required() {
		t.Fatalf("%s (LEDGER_TEST_POLYGLOT=require: make test installs it)", msg)
	}
	t.Skipf("%s: skipped (make test installs it)", msg)
}

// cleanEnv is the environment without the ledger's own variables (so ledgerd
// runs on its embedded engine whatever the caller's shell says) and without
// Python's (so the system interpreter sees only its own packages).
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "LEDGER_") || strings.HasPrefix(kv, "PYTHON") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// startLedgerd runs a fresh ledgerd (with flags: the embedded engine unless
// they give --redis-url) on a loopback port it binds itself until the test
// ends, waits until it reports SERVING, and returns its address.
func startLedgerd(t *testing.T, flags ...string) string {
	t.Helper()
	return startProcess(t, flags...).addr
}

// startLedgerdHTTP is startLedgerd with the HTTP/JSON API on a loopback
// port too; it returns both addresses.
func startLedgerdHTTP(t *testing.T, flags ...string) (string, string) {
	t.Helper()
	d := startProcess(t, append(flags, "--http-listen", "127.0.0.1:0")...)
	httpAddr, err := ledgertest.ListenAddr(d.log.String, "HTTP API serving", d.exited, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return d.addr, httpAddr
}

// startProcess launches ledgerd with flags until the test ends.
func startProcess(t *testing.T, flags ...string) *ledgerdProcess {
	t.Helper()
	d, err := launchLedgerd(ledgertest.LedgerdBinary(t, tmpDir), "127.0.0.1:0", flags...)
	if err != nil {
		t.Fatalf("ledgerd never served: %v", err)
	}
	t.Cleanup(func() {
		if err := d.stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("ledgerd log:\n%s", d.log.String())
		}
	})
	return d
}

// ledgerdProcess is a ledgerd started by launchLedgerd.
type ledgerdProcess struct {
	addr string
	cmd  *exec.Cmd
	log  *ledgertest.Buffer
	// exited is closed once the process has ended and waitErr is set:
	// closed, not sent on, so that every wait for the end sees it.
	exited  chan struct{}
	waitErr error
}

// launchLedgerd runs ledgerd (embedded engine, with flags) listening on
// listen, reads the address it bound from its log (listen may have port 0:
// then no other process can take the port between its choice and the bind)
// and waits until it reports SERVING there. When it does not (it exited, or
// did not serve in time), it is killed and the error carries its log.
func launchLedgerd(bin, listen string, flags ...string) (*ledgerdProcess, error) {
	d := &ledgerdProcess{log: &ledgertest.Buffer{}, exited: make(chan struct{})}
	d.cmd = exec.Command(bin, append([]string{"--listen", listen}, flags...)...)
	d.cmd.Env = cleanEnv()
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	d.cmd.WaitDelay = 10 * time.Second // a process holding its output open cannot hold Wait
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(d.exited)
		d.waitErr = d.cmd.Wait()
	}()
	addr, err := ledgertest.ListenAddr(d.log.String, "ledgerd serving", d.exited, 2*time.Minute)
	if err == nil {
		d.addr = addr
		err = ledgertest.WaitServing(addr, d.exited, 30*time.Second)
	}
	if err != nil {
		_ = d.cmd.Process.Kill()
		<-d.exited
		return nil, fmt.Errorf("ledgerd %v (%v)\n%s", err, d.waitErr, d.log.String())
	}
	return d, nil
}

// stop sends SIGTERM and waits for ledgerd to exit, killing it when it has
// not within 20s. It reports an exit that was not clean.
func (d *ledgerdProcess) stop() error {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		if d.waitErr != nil {
			return fmt.Errorf("ledgerd did not stop cleanly: %v", d.waitErr)
		}
		return nil
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		return fmt.Errorf("ledgerd did not stop within 20s of SIGTERM")
	}
}

// runClient runs an example client against addr and fails the test unless it
// exits 0 having printed want.
func runClient(t *testing.T, want string, name string, args ...string) {
	t.Helper()
	out, _, err := runExample(repoRoot(t), 2*time.Minute, name, args...)
	t.Logf("%s %s:\n%s", name, strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	if !strings.Contains(string(out), want) {
		t.Fatalf("%s %s exited 0 without printing %q", name, strings.Join(args, " "), want)
	}
}

// runExample runs an example client in dir and returns its output: all of
// it, standard output and error as they came, and its standard output
// alone. At timeout the client is asked to stop (SIGTERM: the Python fault
// scenarios then print where every thread stood), and killed 10s later if
// it has not; the error then says it did not finish. Python writes its
// output unbuffered, so that what it printed until then is kept.
func runExample(dir string, timeout time.Duration, name string, args ...string) (all, stdout []byte, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = cleanEnv("PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	// Once the client exits (or is stopped at the timeout), its output is
	// read for at most this long: anything else holding the pipe open
	// cannot hold the test.
	cmd.WaitDelay = 10 * time.Second
	var both, out ledgertest.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(&out, &both), &both
	err = cmd.Run()
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("did not finish within %s (%v)", timeout, err)
	}
	return []byte(both.String()), []byte(out.String()), err
}
