// Package redistest runs real redis-server processes for tests: each on a
// free loopback port, with a scratch directory, killed when the test (or the
// test binary) ends. Tests of the ledger never use a Redis mock.
package redistest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// MissingMessage is the one line a test prints when redis-server is not
// installed.
const MissingMessage = "redis-server not found on PATH: run `make test` (it installs Debian's redis-server as root) or `sudo apt-get install redis-server`"

// Server is one running redis-server.
type Server struct {
	// Addr is host:port on loopback.
	Addr string
	// Dir is the server's working directory (RDB/AOF files).
	Dir string
	// TLS is the client configuration of a server started by StartTLS.
	TLS *tls.Config

	cmd    *exec.Cmd
	args   []string
	done   chan struct{}
	output *bytes.Buffer
}

// Start starts a redis-server for one test and stops it at the test's end.
// Extra args are redis-server options, e.g. "--maxmemory", "10mb". A missing
// redis-server fails the test with MissingMessage.
//
// Every server started here (cluster nodes too) runs with syncAtOnce: a
// replica's full sync starts as soon as it asks, not after the 5 s Redis
// waits by default for more replicas to share a diskless transfer.
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	dir := tb.TempDir()
	s, err := start(dir, args)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// StartTLS starts a redis-server that only accepts TLS, with the PEM
// certificate and key given, trusting clients of caFile (client
// certificates are not required). clientTLS is how clients connect.
func StartTLS(tb testing.TB, certFile, keyFile, caFile string, clientTLS *tls.Config) *Server {
	tb.Helper()
	s, err := startWith(tb.TempDir(), nil, clientTLS, func(port int) []string {
		return []string{"--port", "0", "--tls-port", strconv.Itoa(port), "--tls-cert-file", certFile,
			"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no"}
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func start(dir string, args []string) (*Server, error) {
	return startWith(dir, args, nil, func(port int) []string { return []string{"--port", strconv.Itoa(port)} })
}

// syncAtOnce sets repl-diskless-sync-delay to 0, so that a test waiting
// for a replica to come online (at the start, after a restart or a
// failover) does not wait 5 s more for nothing. Options given by a test
// come after it, so a test may set another delay.
var syncAtOnce = []string{"--repl-diskless-sync-delay", "0"}

func startWith(dir string, args []string, clientTLS *tls.Config, listen func(port int) []string) (*Server, error) {
	args = append(slices.Clone(syncAtOnce), args...)
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New(MissingMessage)
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, TLS: clientTLS, args: append(listen(port), args...)}
		if lastErr = s.launch(path); lastErr == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("redis-server did not start: %w", lastErr)
}

func (s *Server) launch(path string) error {
	argv := []string{
		"--bind", "127.0.0.1",
		"--dir", s.Dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--logfile", "",
	}
	argv = append(argv, s.args...)
	s.cmd = exec.Command(path, argv...)
	s.output = &bytes.Buffer{}
	s.cmd.Stdout, s.cmd.Stderr = s.output, s.output
	// If the test binary dies, the server dies with it.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()

	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DisableIdentity: true, TLSConfig: s.TLS})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("redis-server exited: %s", lastLine(s.output.String()))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil {
			// Another server may hold the port (another test binary's): then
			// this one could not bind it, and the caller tries another.
			if pid := infoField(info, "process_id"); pid != strconv.Itoa(s.cmd.Process.Pid) {
				s.Stop()
				return fmt.Errorf("%s: address already in use by redis-server pid %s", s.Addr, pid)
			}
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	return errors.New("redis-server did not answer INFO within 10s")
}

// infoField returns the value of name in an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// Running reports whether the server process is alive.
func (s *Server) Running() bool {
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Restart starts the server again after Stop (or a crash), on the same
// port, directory (its RDB/AOF files) and options.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Stop()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatal(MissingMessage)
	}
	var lastErr error
	for range 50 { // the port may take a moment to be free again
		if lastErr = s.launch(path); lastErr == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	tb.Fatalf("restarting redis-server: %v", lastErr)
}

// Stop kills the server (SIGKILL) and waits for it to exit.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Pause stops the server process (SIGSTOP) until Resume, or the test's
// end: it keeps its connections, and the kernel still completes new ones,
// but it reads and answers nothing, as a host that hangs. Commands sent to
// it meanwhile run once it resumes.
func (s *Server) Pause(tb testing.TB) {
	tb.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		tb.Fatalf("pausing redis-server %s: %v", s.Addr, err)
	}
	tb.Cleanup(s.Resume)
}

// Resume lets a paused server run again (SIGCONT).
func (s *Server) Resume() {
	if s.Running() {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Client returns a client of the server, closed at the test's end.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, TLSConfig: s.TLS})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

var (
	sharedMu sync.Mutex
	shared   *Server
)

// Main runs a test binary with one shared redis-server (see Shared), and
// stops it afterwards. Call it from TestMain.
func Main(m *testing.M) {
	os.Exit(runMain(m))
}

// Run is Main that returns the exit status instead, for a TestMain with
// more to clean up.
func Run(m *testing.M) int { return runMain(m) }

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	s, err := start(dir, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Stop()
	defer stopSharedCluster()
	sharedMu.Lock()
	shared = s
	sharedMu.Unlock()
	return m.Run()
}

// Shared returns the server Main started. Tests sharing it keep apart by
// using their own tenants or operation ids.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil {
		tb.Fatal("redistest.Shared: TestMain must call redistest.Main")
	}
	return shared
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLine(s string) string {
	s = string(bytes.TrimSpace([]byte(s)))
	if i := bytes.LastIndexByte([]byte(s), '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// EachBackend runs f as parallel subtests: "redis", on the shared
// redis-server (see Main); "cluster", on the shared 3-master Redis Cluster
// (see SharedCluster); and "embedded", on a fresh in-process engine
// (miniredis with TTLs on the real clock, as ledgerd runs without Redis).
// Tests on the shared servers keep apart by tenant or operation id.
func EachBackend(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient)) {
	t.Helper()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		f(t, Shared(t).Client(t))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		f(t, SharedCluster(t).Client(t))
	})
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		f(t, Embedded(t))
	})
}

// Embedded starts a fresh in-process engine for t (miniredis with TTLs on
// the real clock, as ledgerd runs without Redis) and returns a client of
// it; both are closed when t ends.
func Embedded(t testing.TB) *redis.Client {
	t.Helper()
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// CreateUser adds an ACL user to the server (ACL SETUSER name on >password
// rules...), for tests that run as a restricted user.
func (s *Server) CreateUser(tb testing.TB, name, password, rules string) {
	tb.Helper()
	c := s.Client(tb)
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + password}
	for _, r := range strings.Fields(rules) {
		args = append(args, r)
	}
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		tb.Fatalf("ACL SETUSER %s: %v", name, err)
	}
}

// RequireNoACLDenials fails the test if the server refused user any
// command, key or channel (ACL LOG) other than the commands in except
// (as ACL LOG names them, e.g. "config|get"): a refusal on a path the
// caller survives (go-redis logs it and goes on) is a missing rule too.
func (s *Server) RequireNoACLDenials(tb testing.TB, user string, except ...string) {
	tb.Helper()
	entries, err := s.Client(tb).ACLLog(context.Background(), 128).Result()
	if err != nil {
		tb.Fatalf("ACL LOG on %s: %v", s.Addr, err)
	}
	for _, e := range entries {
		if e.Username == user && !slices.Contains(except, e.Object) {
			tb.Errorf("%s refused %s: %s %s (%s)", s.Addr, user, e.Reason, e.Object, e.Context)
		}
	}
}

// UserClient returns a client of the server that authenticates as an ACL
// user, closed at the test's end.
func (s *Server) UserClient(tb testing.TB, name, password string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Username: name, Password: password, DisableIdentity: true, TLSConfig: s.TLS})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
