package faults

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/autopipe"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redisconf"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

var tmpDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ledger-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tmpDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// long reports whether the larger load runs were asked for
// (LEDGER_TEST_FAULTS=long).
func long() bool { return os.Getenv("LEDGER_TEST_FAULTS") == "long" }

// scale returns n, or n times factor for the long runs.
func scale(n, factor int) int {
	if long() {
		return n * factor
	}
	return n
}

// stack is a ledger service running in the test process.
type stack struct {
	Addr    string
	Ledger  *ledger.Ledger
	scripts atomic.Int64 // script runs the ledger asked for
	failed  atomic.Int64 // ... that ended in an error
	// compaction: its pipelines of scripts, those that ended in an error,
	// the records cut and the walks that reached the end of a master's
	// keys (RunCompactor; startStack does not run it).
	compactions, compactFailed, compacted, compactPasses atomic.Int64
}

// redisOptions are go-redis's options as ledgerd sets them in
// --redis-mode single (internal/redisconf): the caller's deadline bounds
// every Redis call; go-redis re-sends a command after a read timeout or a
// broken connection (MaxRetries).
func redisOptions(addr string) *redis.Options {
	o := &redis.Options{Addr: addr}
	redisconf.Single(o)
	return o
}

// clusterClient returns a Redis Cluster client set up as ledgerd sets up
// its own in --redis-mode cluster (internal/redisconf, shared with
// cmd/ledgerd): the slot map reloaded every second, or a failed-over
// master's slots stay unreachable for up to a minute. withAutopipe adds
// the rest of what ledgerd does.
func clusterClient(addrs []string) *redis.ClusterClient {
	o := &redis.ClusterOptions{Addrs: addrs}
	redisconf.Cluster(o)
	return redis.NewClusterClient(o)
}

// failoverClient returns a Sentinel client set up as ledgerd sets up its
// own in --redis-mode sentinel (internal/redisconf, shared with
// cmd/ledgerd).
func failoverClient(master string, sentinels []string) *redis.Client {
	o := &redis.FailoverOptions{MasterName: master, SentinelAddrs: sentinels}
	redisconf.Failover(o)
	return redis.NewFailoverClient(o)
}

// withAutopipe enables on rdb the batching hook ledgerd enables by default
// (--redis-autopipeline; internal/redisconf, shared with cmd/ledgerd), and
// closes the hook and then rdb when the test ends. Hooks added to rdb after
// it see each script once, batched or not.
func withAutopipe(t testing.TB, rdb redis.UniversalClient) *autopipe.Hook {
	h := redisconf.Autopipeline(rdb)
	t.Cleanup(func() { h.Close(); _ = rdb.Close() })
	return h
}

// startStack runs a ledger (with its sweeper) and its gRPC service on rdb
// until the test ends.
func startStack(t testing.TB, rdb redis.UniversalClient, policy string, opts ledger.Options) *stack {
	t.Helper()
	pol, err := ledger.ParsePolicies([]byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	s := &stack{}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts.Policies, opts.Logger = pol, log
	opts.Observer = func(e ledger.Event) {
		switch {
		case e.Type == ledger.EventScript && e.Op == "Compact":
			s.compactions.Add(1)
			if e.Failed {
				s.compactFailed.Add(1)
			}
		case e.Type == ledger.EventCompacted:
			s.compacted.Add(int64(e.Count))
		case e.Type == ledger.EventCompactionPass:
			s.compactPasses.Add(1)
		// Scripts only: the sweeper's read of the lease indexes (op Sweep)
		// is reported too, but runs no script.
		case e.Type == ledger.EventScript && e.Op != "Sweep":
			s.scripts.Add(1)
			if e.Failed {
				s.failed.Add(1)
			}
		}
	}
	l, err := ledger.New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Ledger = l
	svc := server.New(server.Config{Ledger: l, Logger: log})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = lis.Addr().String()
	go func() { _ = svc.Serve(lis) }()
	ctx, cancel := context.WithCancel(context.Background())
	swept := make(chan struct{})
	go func() { l.RunSweeper(ctx, 100*time.Millisecond); close(swept) }()
	t.Cleanup(func() {
		cancel()
		<-swept
		sctx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		svc.Shutdown(sctx)
	})
	return s
}

// ledgerd is a ledgerd process, restartable on the same address.
type ledgerd struct {
	Addr string
	args []string

	cmd *exec.Cmd
	// exited is closed once the process has ended: closed, not sent on,
	// so that every wait for the end sees it.
	exited chan struct{}
	log    *ledgertest.Buffer
	starts int
}

// startLedgerd runs ledgerd on Redis at redisURL with the policy, on a free
// loopback port, until the test ends; extra are more flags.
func startLedgerd(t testing.TB, redisURL, policy string, extra ...string) *ledgerd {
	t.Helper()
	bin := ledgertest.LedgerdBinary(t, tmpDir)
	pfile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pfile, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &ledgerd{log: &ledgertest.Buffer{}}
	var err error
	for range 3 { // the free port may be taken before ledgerd binds it
		d.Addr = ledgertest.FreeAddr(t)
		d.args = append([]string{bin, "--listen", d.Addr, "--redis-url", redisURL, "--policy", pfile,
			"--sweep-interval", "100ms", "--log-level", "warn"}, extra...)
		if err = d.start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("ledgerd did not start: %v\n%s", err, d.log.String())
	}
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("ledgerd log:\n%s", d.log.String())
		}
	})
	return d
}

func (d *ledgerd) start() error {
	d.starts++
	fmt.Fprintf(d.log, "--- start %d\n", d.starts)
	d.cmd = exec.Command(d.args[0], d.args[1:]...)
	d.cmd.Env = cleanEnv()
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	d.exited = exited
	cmd := d.cmd
	go func() {
		defer close(exited)
		_ = cmd.Wait()
	}()
	if err := ledgertest.WaitServing(d.Addr, exited, 60*time.Second); err != nil {
		d.kill()
		return fmt.Errorf("ledgerd %w", err)
	}
	return nil
}

// kill sends SIGKILL and waits for the process to exit.
func (d *ledgerd) kill() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	d.cmd = nil
}

// restart starts ledgerd again on the same address (the port may take a
// moment to be free).
func (d *ledgerd) restart(t testing.TB) {
	t.Helper()
	var err error
	for range 20 {
		if err = d.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("ledgerd did not restart: %v\n%s", err, d.log.String())
}

// cleanEnv is the environment without the ledger's own variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEDGER_") {
			env = append(env, kv)
		}
	}
	return env
}

// redisInfo returns one field of INFO section (0 when absent).
func redisInfo(t testing.TB, rdb *redis.Client, section, prefix string) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix)
		if !ok {
			continue
		}
		end := strings.IndexAny(rest, ",\r")
		if end < 0 {
			end = len(rest)
		}
		n, _ := strconv.ParseInt(rest[:end], 10, 64)
		return n
	}
	return 0
}

// scriptRuns returns how many FCALL, EVALSHA and EVAL calls Redis has run without
// an error (INFO commandstats: calls minus failed_calls).
func scriptRuns(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:")
		if !ok {
			rest, ok = strings.CutPrefix(line, "cmdstat_eval:")
		}
		if !ok {
			rest, ok = strings.CutPrefix(line, "cmdstat_fcall:")
		}
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			x, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				n += x
			case "failed_calls":
				n -= x
			}
		}
	}
	return n
}
