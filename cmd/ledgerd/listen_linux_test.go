package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestLocalhostServedOnlyWhereItIsLoopback runs ledgerd without
// authentication on --listen localhost:0 in a mount namespace of its own
// whose /etc/hosts maps localhost to a non-loopback address of this machine
// (as a hosts file or a resolver may): ledgerd must refuse to start, naming
// the address it bound, instead of serving every operation to the network.
// The same namespace with localhost at 127.0.0.1 serves. It needs a
// non-loopback IPv4 address and the right to unshare and bind-mount (root),
// and is skipped without them.
func TestLocalhostServedOnlyWhereItIsLoopback(t *testing.T) {
	ip := ledgertest.NonLoopbackIPv4(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	hosts := func(t *testing.T, addr string) string {
		f := filepath.Join(t.TempDir(), "hosts")
		if err := os.WriteFile(f, []byte(addr+" localhost\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	// ledgerd, with /etc/hosts replaced by hostsFile in its own namespace.
	withHosts := func(hostsFile string, args ...string) *exec.Cmd {
		cmd := exec.Command("unshare", append([]string{"-m", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hostsFile, self}, args...)...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "LEDGER_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, runAsLedgerd+"=1")
		return cmd
	}
	probe := hosts(t, ip)
	if out, err := exec.Command("unshare", "-m", "sh", "-c", `mount --bind "$0" /etc/hosts && cat /etc/hosts`, probe).CombinedOutput(); err != nil || !strings.Contains(string(out), ip+" localhost") {
		t.Skipf("cannot replace /etc/hosts in a mount namespace: %v %s", err, out)
	}

	t.Run("localhost elsewhere", func(t *testing.T) {
		out := &ledgertest.Buffer{}
		cmd := withHosts(probe, "--listen", "localhost:0")
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var waitErr error
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			select {
			case waitErr = <-exited:
			default:
				if strings.Contains(out.String(), "ledgerd serving") || time.Now().After(deadline) {
					_ = cmd.Process.Kill()
					<-exited
					t.Fatalf("ledgerd did not refuse to start without authentication on %s:\n%s", ip, out.String())
				}
				continue
			}
			break
		}
		if waitErr == nil || !strings.Contains(out.String(), `--listen "localhost:0" bound `+ip+":") ||
			!strings.Contains(out.String(), "without authentication (--auth-file) ledgerd only serves a loopback address") {
			t.Fatalf("ledgerd exited with %v, want the refusal naming %s:\n%s", waitErr, ip, out.String())
		}
	})

	t.Run("localhost on loopback", func(t *testing.T) {
		out := &ledgertest.Buffer{}
		cmd := withHosts(hosts(t, "127.0.0.1"), "--listen", "localhost:0")
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
		})
		addr, err := ledgertest.ListenAddr(out.String, "ledgerd serving", exited, 30*time.Second)
		if err != nil {
			t.Fatalf("ledgerd: %v\n%s", err, out.String())
		}
		if !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Fatalf("ledgerd serves %s, want 127.0.0.1", addr)
		}
	})
}
