package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/opledger/ledger/client"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/h2test"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

// startLimited serves the ledger on the shared redis-server with these
// connection limits and extra options, until the test ends, and returns its
// address.
func startLimited(t *testing.T, limits server.ConnectionLimits, opts ...grpc.ServerOption) string {
	t.Helper()
	addr, _ := startLimitedService(t, limits, opts...)
	return addr
}

// startLimitedService is startLimited, and also returns the service.
func startLimitedService(t *testing.T, limits server.ConnectionLimits, opts ...grpc.ServerOption) (string, *server.Service) {
	t.Helper()
	rdb := redistest.Shared(t).Client(t)
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	l, err := ledger.New(rdb, ledger.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(server.Config{Ledger: l, Logger: log, Connections: limits}, opts...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { _ = svc.Serve(lis); close(served) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		svc.Shutdown(ctx)
		<-served
	})
	return lis.Addr().String(), svc
}

// dialLedger returns a client.Client on its own connection to addr, closed
// when the test ends.
func dialLedger(t *testing.T, addr string) *client.Client {
	t.Helper()
	cl, err := client.Dial(addr, client.WithCallTimeout(30*time.Second),
		client.WithToolPolicy("conn.send", client.ToolPolicy{Timeout: 10 * time.Second, Effect: client.EffectIrreversible}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// send drives operation id through cl.Do; its effect is counted at dest.
func send(ctx context.Context, cl *client.Client, dest *effectCounter, id string) error {
	_, err := cl.Do(ctx, client.Op{ID: id, Tool: "conn.send", Params: map[string]any{"to": "x"}},
		func(ctx context.Context, a client.Attempt) (client.Result, error) {
			dest.apply(id)
			return client.Result{ResourceID: "sent-" + id}, nil
		})
	return err
}

// wantApplied fails unless the effect of each id was applied exactly once.
func wantApplied(t *testing.T, dest *effectCounter, ids ...string) {
	t.Helper()
	dest.mu.Lock()
	defer dest.mu.Unlock()
	for _, id := range ids {
		if n := dest.applied[id]; n != 1 {
			t.Errorf("%s: effect applied %d times, want once", id, n)
		}
	}
}

// waitFor polls cond until it holds, or fails the test after bound.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", bound, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connCounter is a stats handler that counts the server's connections.
type connCounter struct{ begun, ended atomic.Int64 }

func (c *connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c *connCounter) HandleRPC(context.Context, stats.RPCStats)                       {}
func (c *connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (c *connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	switch s.(type) {
	case *stats.ConnBegin:
		c.begun.Add(1)
	case *stats.ConnEnd:
		c.ended.Add(1)
	}
}

// A peer that sends part of the HTTP/2 preface and goes silent is
// disconnected once the handshake timeout has passed; clients that finish
// their handshake are served as before.
func TestHandshakeTimeoutDisconnectsSilentPeers(t *testing.T) {
	t.Parallel()
	addr := startLimited(t, server.ConnectionLimits{HandshakeTimeout: 200 * time.Millisecond})
	const peers = 5
	var wg sync.WaitGroup
	errs := make([]error, peers)
	for i := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close()
			if _, err := conn.Write([]byte(h2test.Preface[:10])); err != nil {
				errs[i] = err
				return
			}
			// Generous: far longer than the handshake timeout, far
			// shorter than grpc-go's own (120s).
			_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
			_, err = io.Copy(io.Discard, conn)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				errs[i] = errors.New("still connected after 15s")
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("peer %d: %v", i, err)
		}
	}
	dest := &effectCounter{applied: map[string]int{}}
	id := "conn-handshake-" + randomHex(6)
	if err := send(context.Background(), dialLedger(t, addr), dest, id); err != nil {
		t.Fatalf("Do after the silent peers: %v", err)
	}
	wantApplied(t, dest, id)
}

// A client's connection without calls is closed (GOAWAY) after
// MaxConnectionIdle, and the same client's next call reconnects: its tool
// runs exactly once.
func TestIdleConnectionIsClosedAndClientReconnects(t *testing.T) {
	t.Parallel()
	conns := &connCounter{}
	addr := startLimited(t, server.ConnectionLimits{MaxConnectionIdle: 500 * time.Millisecond}, grpc.StatsHandler(conns))
	cl := dialLedger(t, addr)
	dest := &effectCounter{applied: map[string]int{}}
	first, second := "conn-idle-1-"+randomHex(6), "conn-idle-2-"+randomHex(6)
	if err := send(context.Background(), cl, dest, first); err != nil {
		t.Fatalf("first Do: %v", err)
	}
	waitFor(t, 15*time.Second, "the idle connection closed by the server", func() bool { return conns.ended.Load() >= 1 })
	if err := send(context.Background(), cl, dest, second); err != nil {
		t.Fatalf("Do after the idle close: %v", err)
	}
	wantApplied(t, dest, first, second)
	if n := conns.begun.Load(); n < 2 {
		t.Errorf("%d connection, want a second one after the idle close", n)
	}
}

// A peer that stops answering (a dead host, a dropped NAT mapping) is found
// by the server's keepalive ping: no answer within KeepaliveTimeout closes
// the connection.
func TestKeepaliveClosesDeadPeer(t *testing.T) {
	t.Parallel()
	addr := startLimited(t, server.ConnectionLimits{KeepaliveTime: time.Second, KeepaliveTimeout: 500 * time.Millisecond,
		MaxConnectionIdle: time.Hour})
	// From here on the peer reads and never writes: no SETTINGS ACK, no
	// PING ACK.
	conn, err := h2test.Open(addr, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pinged, goAway, err := h2test.ReadUntilClosed(conn)
	if err != nil {
		t.Fatalf("still connected after 20s (pinged: %v)", pinged)
	}
	if goAway {
		t.Fatal("GOAWAY: the connection was closed for another reason than the unanswered ping")
	}
	if !pinged {
		t.Error("the server closed the connection without pinging it first")
	}
}

// Calls beyond MaxConcurrentStreams on one connection wait for a stream
// rather than fail: every call succeeds, each tool runs exactly once, and
// the server never runs more than the limit at once.
func TestMaxConcurrentStreamsQueuesCalls(t *testing.T) {
	t.Parallel()
	const limit, calls = 4, 40
	var inFlight, most atomic.Int64
	hold := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		// Hold the call a little, or until more than the limit run, so
		// that calls overlap: without the limit they would pile up here.
		for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end) && inFlight.Load() <= limit; {
			time.Sleep(time.Millisecond)
		}
		return handler(ctx, req)
	}
	addr := startLimited(t, server.ConnectionLimits{MaxConcurrentStreams: limit}, grpc.ChainUnaryInterceptor(hold))
	cl := dialLedger(t, addr)
	dest := &effectCounter{applied: map[string]int{}}
	prefix := "conn-streams-" + randomHex(6)
	ids := make([]string, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = send(context.Background(), cl, dest, ids[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Do(%s): %v", ids[i], err)
		}
	}
	wantApplied(t, dest, ids...)
	if m := most.Load(); m > limit {
		t.Errorf("%d calls ran at once on one connection, limit %d", m, limit)
	} else if m < 2 {
		t.Errorf("at most %d call ran at once: the calls did not overlap, the test tested nothing", m)
	}
}

// Without limits configured, the server advertises its default bound on
// concurrent streams in its HTTP/2 SETTINGS.
func TestDefaultMaxConcurrentStreamsAdvertised(t *testing.T) {
	t.Parallel()
	addr := startLimited(t, server.ConnectionLimits{})
	got, ok, err := h2test.MaxConcurrentStreams(addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || got != server.DefaultMaxConcurrentStreams {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d (sent: %v), want %d", got, ok, server.DefaultMaxConcurrentStreams)
	}
}

// A client balancing with round_robin (client.md, "Several ledgerd
// instances") does not wait for a call after the idle close: gRPC
// reconnects it at once, so an open Client of that kind keeps its
// connections, re-established after each MaxConnectionIdle, until it is
// closed. Its calls are served as before.
func TestIdleCloseRoundRobinClientReconnectsAtOnce(t *testing.T) {
	t.Parallel()
	conns := &connCounter{}
	addr := startLimited(t, server.ConnectionLimits{MaxConnectionIdle: 300 * time.Millisecond}, grpc.StatsHandler(conns))
	cl, err := client.Dial("dns:///"+addr, client.WithCallTimeout(30*time.Second),
		client.WithDialOptions(grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`)),
		client.WithToolPolicy("conn.send", client.ToolPolicy{Timeout: 10 * time.Second, Effect: client.EffectIrreversible}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	dest := &effectCounter{applied: map[string]int{}}
	first, second := "conn-rr-1-"+randomHex(6), "conn-rr-2-"+randomHex(6)
	if err := send(context.Background(), cl, dest, first); err != nil {
		t.Fatalf("first Do: %v", err)
	}
	// No call from here on: every connection after the first was opened
	// by the client on its own after an idle close.
	waitFor(t, 30*time.Second, "two idle closes, each followed by a new connection without a call", func() bool {
		return conns.ended.Load() >= 2 && conns.begun.Load() >= 3
	})
	if err := send(context.Background(), cl, dest, second); err != nil {
		t.Fatalf("Do after the idle closes: %v", err)
	}
	wantApplied(t, dest, first, second)
}

// With MaxConnections N, N clients hold a connection each; the next
// connection is refused at once (its call fails UNAVAILABLE, it does not
// wait in the accept queue until its deadline), the N keep working, and once
// one of them closes a new client is served. Each tool runs exactly once.
func TestMaxConnectionsRefusesTheNextConnection(t *testing.T) {
	t.Parallel()
	const limit = 3
	addr, svc := startLimitedService(t, server.ConnectionLimits{MaxConnections: limit})
	dest := &effectCounter{applied: map[string]int{}}
	prefix := "conn-max-" + randomHex(6)
	clients := make([]*client.Client, limit)
	var ids []string
	for i := range clients {
		clients[i] = dialLedger(t, addr)
		id := fmt.Sprintf("%s-open-%d", prefix, i)
		if err := send(context.Background(), clients[i], dest, id); err != nil {
			t.Fatalf("client %d of %d: %v", i+1, limit, err)
		}
		ids = append(ids, id)
	}
	if got := svc.Connections(); got.Open != limit {
		t.Fatalf("%d connections open, want %d", got.Open, limit)
	}

	extra, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	// The deadline only catches a connection left waiting: a refused one
	// fails long before it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	_, err = healthpb.NewHealthClient(extra).Check(ctx, &healthpb.HealthCheckRequest{})
	cancel()
	// Closed at once: it would otherwise try again in the background, and
	// could take the place meant for the new client below.
	_ = extra.Close()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("call over connection %d: %v, want UNAVAILABLE (refused at once)", limit+1, err)
	}
	if got := svc.Connections(); got.Refused < 1 || got.Open != limit {
		t.Errorf("after the refusal: %+v, want %d open and at least 1 refused", got, limit)
	}

	for i, cl := range clients {
		id := fmt.Sprintf("%s-again-%d", prefix, i)
		if err := send(context.Background(), cl, dest, id); err != nil {
			t.Errorf("client %d after the refusal: %v", i+1, err)
		}
		ids = append(ids, id)
	}

	_ = clients[0].Close()
	waitFor(t, 15*time.Second, "the closed client's connection released", func() bool { return svc.Connections().Open < limit })
	id := prefix + "-after-close"
	if err := send(context.Background(), dialLedger(t, addr), dest, id); err != nil {
		t.Fatalf("new client after one closed: %v", err)
	}
	wantApplied(t, dest, append(ids, id)...)
}

// A connection that has lived MaxConnectionAge is sent GOAWAY, whether or
// not it is busy or idle: its debug data says why ("max_age").
func TestMaxConnectionAgeSendsGoAway(t *testing.T) {
	t.Parallel()
	addr := startLimited(t, server.ConnectionLimits{MaxConnectionAge: 300 * time.Millisecond,
		MaxConnectionAgeGrace: 10 * time.Second, MaxConnectionIdle: time.Hour})
	conn, err := h2test.Open(addr, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if debug, err := h2test.GoAwayDebug(conn); err != nil || debug != "max_age" {
		t.Fatalf("GOAWAY debug data %q (%v) within 15s, want \"max_age\"", debug, err)
	}
}

// holdReserve is an interceptor that holds the Reserve of operation id
// until release is closed (or the call's context ends), and counts the
// Reserves of id the server runs: a retry of it would run it again.
type holdReserve struct {
	id      string
	entered chan struct{}
	release chan struct{}
	runs    atomic.Int64
	once    sync.Once
}

func newHoldReserve(id string) *holdReserve {
	return &holdReserve{id: id, entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdReserve) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if r, ok := req.(*ledgerv1.ReserveRequest); ok && r.GetOperationId() == h.id && h.runs.Add(1) == 1 {
		h.once.Do(func() { close(h.entered) })
		select {
		case <-h.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return handler(ctx, req)
}

// A call running when its connection reaches MaxConnectionAge finishes on
// that connection (within MaxConnectionAgeGrace): the client's later calls
// go over a new connection meanwhile, and the held call then succeeds,
// once, without a retry.
func TestMaxConnectionAgeLetsRunningCallsFinish(t *testing.T) {
	t.Parallel()
	conns := &connCounter{}
	held := newHoldReserve("conn-age-held-" + randomHex(6))
	addr := startLimited(t, server.ConnectionLimits{MaxConnectionAge: 300 * time.Millisecond,
		MaxConnectionAgeGrace: time.Minute, MaxConnectionIdle: time.Hour},
		grpc.StatsHandler(conns), grpc.ChainUnaryInterceptor(held.intercept))
	cl := dialLedger(t, addr)
	dest := &effectCounter{applied: map[string]int{}}
	heldErr := make(chan error, 1)
	go func() { heldErr <- send(context.Background(), cl, dest, held.id) }()
	select {
	case <-held.entered:
	case err := <-heldErr:
		t.Fatalf("the held call returned before it was held: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("the held call did not reach the server within 15s")
	}
	// More calls until one goes over a second connection: the first got
	// its GOAWAY, and holds only the held call.
	ids := []string{held.id}
	waitFor(t, 15*time.Second, "a call over a second connection while the first holds a call", func() bool {
		id := fmt.Sprintf("conn-age-other-%s-%d", randomHex(6), len(ids))
		if err := send(context.Background(), cl, dest, id); err != nil {
			t.Fatalf("Do(%s) while a call is held: %v", id, err)
		}
		ids = append(ids, id)
		return conns.begun.Load() >= 2
	})
	select {
	case err := <-heldErr:
		t.Fatalf("the held call returned before it was released: %v", err)
	default:
	}
	close(held.release)
	if err := <-heldErr; err != nil {
		t.Fatalf("the held call, past its connection's age: %v", err)
	}
	if n := held.runs.Load(); n != 1 {
		t.Errorf("the held Reserve ran %d times on the server, want once (no retry)", n)
	}
	wantApplied(t, dest, ids...)
}

// A call still running MaxConnectionAgeGrace after its connection's GOAWAY
// is cut with the connection; the Go SDK repeats it on a new connection
// (every ledger call is safe to repeat), and the tool runs once.
func TestMaxConnectionAgeGraceCutsStuckCalls(t *testing.T) {
	t.Parallel()
	held := newHoldReserve("conn-grace-" + randomHex(6))
	addr := startLimited(t, server.ConnectionLimits{MaxConnectionAge: 200 * time.Millisecond,
		MaxConnectionAgeGrace: 300 * time.Millisecond, MaxConnectionIdle: time.Hour},
		grpc.ChainUnaryInterceptor(held.intercept))
	dest := &effectCounter{applied: map[string]int{}}
	// Never released: only the end of its connection ends the first run.
	if err := send(context.Background(), dialLedger(t, addr), dest, held.id); err != nil {
		t.Fatalf("Do of the stuck call: %v", err)
	}
	if n := held.runs.Load(); n != 2 {
		t.Errorf("the Reserve ran %d times on the server, want twice (cut, then repeated)", n)
	}
	wantApplied(t, dest, held.id)
}

// A client that never goes idle moves to a new connection after each
// MaxConnectionAge (a new instance, behind a load balancer), without an
// error: with pick_first (the SDK's default) and with round_robin, every
// call succeeds and each tool runs once.
func TestMaxConnectionAgeBusyClientReconnects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, target string
		opts         []client.Option
	}{
		{"pick_first", "", nil},
		{"round_robin", "dns:///", []client.Option{client.WithDialOptions(grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conns := &connCounter{}
			addr := startLimited(t, server.ConnectionLimits{MaxConnectionAge: 200 * time.Millisecond,
				MaxConnectionAgeGrace: 10 * time.Second, MaxConnectionIdle: time.Hour}, grpc.StatsHandler(conns))
			cl, err := client.Dial(tc.target+addr, append(tc.opts, client.WithCallTimeout(30*time.Second),
				client.WithToolPolicy("conn.send", client.ToolPolicy{Timeout: 10 * time.Second, Effect: client.EffectIrreversible}))...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			dest := &effectCounter{applied: map[string]int{}}
			prefix := "conn-age-busy-" + tc.name + "-" + randomHex(6)
			var ids []string
			waitFor(t, 30*time.Second, "three connections, each closed for its age, under calls", func() bool {
				id := fmt.Sprintf("%s-%d", prefix, len(ids))
				if err := send(context.Background(), cl, dest, id); err != nil {
					t.Fatalf("Do(%s): %v", id, err)
				}
				ids = append(ids, id)
				return conns.begun.Load() >= 3 && conns.ended.Load() >= 2
			})
			wantApplied(t, dest, ids...)
		})
	}
}
