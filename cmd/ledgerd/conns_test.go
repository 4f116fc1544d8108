package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/opledger/ledger/internal/h2test"
	"github.com/opledger/ledger/server"
)

// TestConnectionFlags checks the connection limits' flags: their defaults
// are server's, an environment variable sets each, and a flag wins over it.
func TestConnectionFlags(t *testing.T) {
	ledgerdFlags(t) // unsets every LEDGER_* variable until the test ends
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := server.ConnectionLimits{
		HandshakeTimeout:      server.DefaultHandshakeTimeout,
		MaxConnectionIdle:     server.DefaultMaxConnectionIdle,
		KeepaliveTime:         server.DefaultKeepaliveTime,
		KeepaliveTimeout:      server.DefaultKeepaliveTimeout,
		MaxConcurrentStreams:  server.DefaultMaxConcurrentStreams,
		MaxConnections:        server.DefaultMaxConnections,
		MaxConnectionAge:      server.DefaultMaxConnectionAge,
		MaxConnectionAgeGrace: server.DefaultMaxConnectionAgeGrace,
		MaxHealthWatches:      server.DefaultMaxHealthWatches,
	}
	if c.conns != want {
		t.Errorf("defaults %+v, want %+v", c.conns, want)
	}

	t.Setenv("LEDGER_HANDSHAKE_TIMEOUT", "3s")
	t.Setenv("LEDGER_MAX_CONNECTION_IDLE", "15m")
	t.Setenv("LEDGER_KEEPALIVE_TIME", "30s")
	t.Setenv("LEDGER_KEEPALIVE_TIMEOUT", "5s")
	t.Setenv("LEDGER_MAX_CONCURRENT_STREAMS", "250")
	t.Setenv("LEDGER_MAX_CONNECTIONS", "0")
	t.Setenv("LEDGER_MAX_CONNECTION_AGE", "0")
	t.Setenv("LEDGER_MAX_CONNECTION_AGE_GRACE", "45s")
	t.Setenv("LEDGER_MAX_HEALTH_WATCHES", "0")
	if c, err = parseFlags(nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	want = server.ConnectionLimits{HandshakeTimeout: 3 * time.Second, MaxConnectionIdle: 15 * time.Minute,
		KeepaliveTime: 30 * time.Second, KeepaliveTimeout: 5 * time.Second, MaxConcurrentStreams: 250,
		MaxConnections: -1, MaxConnectionAge: -1, MaxConnectionAgeGrace: 45 * time.Second, MaxHealthWatches: -1}
	if c.conns != want {
		t.Errorf("from the environment %+v, want %+v", c.conns, want)
	}

	if c, err = parseFlags([]string{"--handshake-timeout", "4s", "--max-connection-idle", "1h", "--keepalive-time", "2m",
		"--keepalive-timeout", "1s", "--max-concurrent-streams", "100", "--max-connections", "500",
		"--max-connection-age", "2h", "--max-connection-age-grace", "5s", "--max-health-watches", "300"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	want = server.ConnectionLimits{HandshakeTimeout: 4 * time.Second, MaxConnectionIdle: time.Hour,
		KeepaliveTime: 2 * time.Minute, KeepaliveTimeout: time.Second, MaxConcurrentStreams: 100,
		MaxConnections: 500, MaxConnectionAge: 2 * time.Hour, MaxConnectionAgeGrace: 5 * time.Second, MaxHealthWatches: 300}
	if c.conns != want {
		t.Errorf("from flags %+v, want %+v", c.conns, want)
	}
}

// TestRefusesBadConnectionLimits: a limit that is not positive, or not a
// duration (a count), stops ledgerd at start-up with an error naming the
// flag and the value, also when the value came from the flag's environment
// variable (as for ledgerd's other flags).
func TestRefusesBadConnectionLimits(t *testing.T) {
	for _, tc := range []struct{ flag, value string }{
		{"handshake-timeout", "-1s"},
		{"handshake-timeout", "0s"},
		{"handshake-timeout", "ten"},
		{"handshake-timeout", "10"},
		{"max-connection-idle", "-5m"},
		{"max-connection-idle", "0"},
		{"max-connection-idle", "5 min"},
		{"keepalive-time", "-1m"},
		{"keepalive-time", "500ms"}, // grpc-go would raise it to 1s
		{"keepalive-time", "x"},
		{"keepalive-timeout", "-20s"},
		{"keepalive-timeout", "0s"},
		{"keepalive-timeout", "20"},
		{"max-concurrent-streams", "-1"},
		{"max-concurrent-streams", "0"},
		{"max-concurrent-streams", "1e3"},
		{"max-concurrent-streams", "4294967296"},
		{"max-connections", "-1"},
		{"max-connections", "1e4"},
		{"max-connections", "ten"},
		{"max-connection-age", "-30m"},
		{"max-connection-age", "30"},
		{"max-connection-age-grace", "0s"},
		{"max-connection-age-grace", "-1m"},
		{"max-connection-age-grace", "1 min"},
		{"max-health-watches", "-1"},
		{"max-health-watches", "2e3"},
		{"max-health-watches", "many"},
	} {
		args := []string{"--listen", "127.0.0.1:0", "--" + tc.flag, tc.value}
		var out bytes.Buffer
		err := run(context.Background(), args, &out)
		if err == nil || !strings.Contains(err.Error(), "--"+tc.flag) || !strings.Contains(err.Error(), tc.value) {
			t.Errorf("%v: %v, want an error about --%s %q", args, err, tc.flag, tc.value)
		}
		env := "LEDGER_" + strings.ToUpper(strings.ReplaceAll(tc.flag, "-", "_"))
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, tc.value)
			_, err := parseFlags(nil, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.value) {
				t.Errorf("%s=%s: %v, want an error about %q", env, tc.value, err, tc.value)
			}
		})
	}
}

// TestConnectionLimitsServed runs ledgerd with short connection limits and
// checks each on the wire: a peer that sends half the HTTP/2 preface is
// disconnected, a client's connection without calls is closed, a peer that
// does not answer pings is disconnected, and the bound on concurrent
// streams is advertised.
func TestConnectionLimitsServed(t *testing.T) {
	conn, addr, _ := start(t, insecure.NewCredentials(), "--handshake-timeout", "200ms", "--max-connection-idle", "500ms",
		"--max-concurrent-streams", "7")

	// The health checks of start are done: the connection goes idle, the
	// server closes it and the client's channel turns IDLE.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for s := conn.GetState(); s != connectivity.Idle; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("the idle connection is still %v after 15s", s)
		}
	}

	half, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	if _, err := half.Write([]byte(h2test.Preface[:10])); err != nil {
		t.Fatal(err)
	}
	_ = half.SetReadDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.Copy(io.Discard, half); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Error("a peer that sent half the preface is still connected after 15s")
	}

	if got, _, err := h2test.MaxConcurrentStreams(addr, 10*time.Second); err != nil || got != 7 {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d (%v), want 7", got, err)
	}

	// A peer that finishes the handshake, then neither writes nor answers,
	// on a ledgerd that pings after 1s of silence (and would close an idle
	// connection only after the default 5 minutes).
	_, addr, _ = start(t, insecure.NewCredentials(), "--keepalive-time", "1s", "--keepalive-timeout", "500ms")
	silent, err := h2test.Open(addr, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	pinged, _, err := h2test.ReadUntilClosed(silent)
	if err != nil {
		t.Fatalf("a peer that answers no ping is still connected after 15s (pinged: %v)", pinged)
	}
	if !pinged {
		t.Error("the server closed the silent peer's connection without pinging it")
	}
}

// TestMaxConnectionsServed runs ledgerd with --max-connections 2: the test's
// connection and one more are served, a third is refused at once (its call
// fails UNAVAILABLE rather than waiting), which the log and the metrics
// show, and the two open ones keep working.
func TestMaxConnectionsServed(t *testing.T) {
	first, addr, out := start(t, insecure.NewCredentials(), "--max-connections", "2", "--metrics-listen", "127.0.0.1:0")
	check := func(conn *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	dial := func() *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	second := dial()
	if err := check(second); err != nil {
		t.Fatalf("second connection: %v", err)
	}
	third := dial()
	err := check(third)
	// Closed at once: it would otherwise try again in the background, and
	// count more refusals.
	_ = third.Close()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("third connection: %v, want UNAVAILABLE (refused at once)", err)
	}
	for i, conn := range []*grpc.ClientConn{first, second} {
		if err := check(conn); err != nil {
			t.Errorf("connection %d after the refusal: %v", i+1, err)
		}
	}
	waitForMetrics(t, metricsAddrOf(t, out), out, `"msg":"connections refused: the server holds its maximum of client connections","max_connections":2,"refused":1`,
		"ledger_connections_open 2", "ledger_connections_refused_total 1")
}

// TestMaxHealthWatchesServed runs ledgerd with --max-health-watches 1: one
// Watch is served, a second is refused at once with RESOURCE_EXHAUSTED
// (Check still answers), which the log and the metrics show.
func TestMaxHealthWatchesServed(t *testing.T) {
	conn, _, out := start(t, insecure.NewCredentials(), "--max-health-watches", "1", "--metrics-listen", "127.0.0.1:0")
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := first.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watch: %v, %v; want SERVING", resp, err)
	}
	second, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second watch: %v, want RESOURCE_EXHAUSTED at once", err)
	}
	if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check with the watches at their bound: %v, %v; want SERVING", resp, err)
	}
	waitForMetrics(t, metricsAddrOf(t, out), out,
		`"msg":"health watches refused: the server holds its maximum of health Watch streams","max_health_watches":1,"refused":1`,
		"ledger_health_watches_open 1", "ledger_health_watches_refused_total 1")
}

// TestMaxConnectionAgeServed runs ledgerd with --max-connection-age: a
// connection that has lived that long is sent GOAWAY ("max_age"), although
// it is neither idle nor silent for long.
func TestMaxConnectionAgeServed(t *testing.T) {
	_, addr, _ := start(t, insecure.NewCredentials(), "--max-connection-age", "300ms", "--max-connection-age-grace", "10s")
	conn, err := h2test.Open(addr, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if debug, err := h2test.GoAwayDebug(conn); err != nil || debug != "max_age" {
		t.Fatalf("GOAWAY debug data %q (%v) within 15s, want \"max_age\"", debug, err)
	}
}
