package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// helperEnv makes the test binary a gRPC server answering health Check on
// the address in its last argument (TestMain): the stand-in for ledgerd in
// TestStartServingOwnsPort. A helper that cannot bind its port stays alive
// without serving, as a server may for a while before it exits.
const helperEnv = "LEDGERBENCH_TEST_HEALTH_SERVER"

// binDir holds the ledgerd the tests build, once for the whole test binary.
var binDir string

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		serveHealth(os.Args[len(os.Args)-1])
	}
	if len(os.Args) > 1 && os.Args[1] == BareCommand {
		// The bare server, for TestBarePairPart.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := BareMain(ctx, os.Args[2:])
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == CycleCommand {
		// The ledger's cycler, for TestPeerPart.
		if err := CycleMain(context.Background(), os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "ledger-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func serveHealth(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		select {} // could not bind: linger, never serving
	}
	s, hs := grpc.NewServer(), health.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	_ = s.Serve(ln)
	os.Exit(0)
}

// startHealthServer serves SERVING health checks in this process on a free
// loopback port: another process's server, as far as startServing's
// child is concerned.
func startHealthServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, hs := grpc.NewServer(), health.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// TestStartServingOwnsPort: when another process's server answers health
// Check on the port of a server the benchmark started, startServing refuses
// it as "address already in use" (so onFreePort starts the server on another
// port) instead of measuring the other server; on a free port it returns the
// server it started, which holds the listening socket.
func TestStartServingOwnsPort(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp: listening sockets cannot be traced to their process here")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(helperEnv, "1")
	other := startHealthServer(t)
	dir := t.TempDir()

	p, err := startServing(nil, self, []string{"-test.run=^$", other}, other, filepath.Join(dir, "taken.log"), "the helper")
	if err == nil {
		p.Stop()
		t.Fatalf("startServing on %s, held by this process, returned the helper (pid %d) as serving", other, p.cmd.Process.Pid)
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("startServing on a port held by another process: %v, want address already in use", err)
	}

	var tried []string
	p, err = onFreePort(func(addr string) (*Process, error) {
		tried = append(tried, addr)
		if len(tried) == 1 {
			addr = other
		}
		return startServing(nil, self, []string{"-test.run=^$", addr}, addr, filepath.Join(dir, "free.log"), "the helper")
	})
	if err != nil || len(tried) != 2 {
		t.Fatalf("onFreePort after %s was taken: %v, %d tries", other, err, len(tried))
	}
	defer p.Stop()
	if p.Addr == other {
		t.Fatalf("the helper was returned on the taken address %s", other)
	}
	if owns, known, err := listenerOwner(p.cmd.Process.Pid, p.Addr); !owns || !known || err != nil {
		t.Fatalf("the helper (pid %d) does not hold %s: owns %v, known %v, %v", p.cmd.Process.Pid, p.Addr, owns, known, err)
	}
	if owns, _, err := listenerOwner(p.cmd.Process.Pid, other); owns || err != nil {
		t.Fatalf("the helper (pid %d) holds %s, the other server's port: %v", p.cmd.Process.Pid, other, err)
	}
}
