package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/autopipe"
	"github.com/opledger/ledger/internal/h2test"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/metrics"
	"github.com/opledger/ledger/server"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// The Redis client's pools in the churn test: commands, and pipelines (the
// autopipelined batches among them). Together they bound ledgerd's Redis
// connections.
const (
	churnPoolSize         = 8
	churnPipelinePoolSize = 4
	churnMaxConns         = churnPoolSize + churnPipelinePoolSize
)

// churnReadTimeout is the Redis client's read timeout in the churn test
// (the URL's read_timeout): a stall outlasts it.
const churnReadTimeout = 150 * time.Millisecond

// churnStack is ledgerd in process, as cmd/ledgerd assembles it (the
// autopipelining Redis client, the metrics interceptors and observer, the
// sweeper and the compactor), on a dedicated redis-server reached through a
// proxy the test disturbs.
type churnStack struct {
	addr  string
	rdb   *redis.Client
	proxy *churnProxy
	admin *redis.Client // straight to the redis-server, for CLIENT LIST
	// The API keys of the credentials file: agent's tenant has no rate
	// limit, limited's has a low one.
	agent, limited string
}

func startChurnStack(t *testing.T) *churnStack {
	t.Helper()
	srv := redistest.Start(t)
	proxy := newChurnProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{
		Addr: proxy.Addr(), DisableIdentity: true, ContextTimeoutEnabled: true,
		PoolSize: churnPoolSize, PipelinePoolSize: churnPipelinePoolSize, ReadTimeout: churnReadTimeout, WriteTimeout: churnReadTimeout,
		// The pipeline pool's buffers as the other pool's (32 KiB, not
		// 128), so that how many connections the pools hold at the end
		// of a burst sways the heap less than the heap margin.
		PipelineReadBufferSize: 32 << 10, PipelineWriteBufferSize: 32 << 10,
	})
	pipe := autopipe.Enable(rdb, autopipe.Options{})
	pol, err := ledger.ParsePolicies([]byte(ledgertest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	// Every line is formatted (debug), and dropped.
	log := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}))
	met := metrics.New(metrics.Options{})
	l, err := ledger.New(rdb, ledger.Options{Policies: pol, Logger: log, Observer: met.Observe,
		UnresolvedLimit: func(string) int { return 100000 }})
	if err != nil {
		t.Fatal(err)
	}
	// Authentication as with --auth-file, and a tenant over its rate.
	var keys []string
	var lines strings.Builder
	lines.WriteString("keys:\n")
	for _, tenant := range []string{"acme", "limited"} {
		key, hash, err := server.NewAPIKey(tenant + "-key")
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
		fmt.Fprintf(&lines, "  - {id: %s-key, tenant: %s, scopes: [agent, reconciler, viewer], secret_sha256: %s}\n", tenant, tenant, hash)
	}
	lines.WriteString("tenants:\n  limited: {rate: 100, burst: 5}\n")
	creds, err := server.ParseCredentials([]byte(lines.String()))
	if err != nil {
		t.Fatal(err)
	}
	// A handshake timeout well under settle's bound, so that the silent
	// peers of a burst are gone within it.
	svc := server.New(server.Config{Ledger: l, Logger: log, Auth: server.NewAuthenticator(creds),
		Connections: server.ConnectionLimits{HandshakeTimeout: time.Second}}, met.ServerOptions()...)
	met.InitializeRPC(svc.GRPC)
	met.WatchStore(l, 0)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { _ = svc.Serve(lis); close(served) }()
	ctx, cancel := context.WithCancel(context.Background())
	var background sync.WaitGroup
	background.Add(2)
	go func() { defer background.Done(); l.RunSweeper(ctx, 50*time.Millisecond) }()
	go func() { defer background.Done(); l.RunCompactor(ctx, 100*time.Millisecond, 100) }()
	t.Cleanup(func() {
		cancel()
		background.Wait()
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		svc.Shutdown(sctx)
		<-served
		pipe.Close()
		_ = rdb.Close()
	})
	return &churnStack{addr: lis.Addr().String(), rdb: rdb, proxy: proxy, admin: srv.Client(t), agent: keys[0], limited: keys[1]}
}

// usage is what the process holds, less what the test's proxy holds.
type usage struct {
	goroutines int // runtime.NumGoroutine, less the proxy's
	fds        int // open file descriptors, less the proxy's sockets and the pools' connections
	redisConns int // connections the redis-server has, but the admin's
	poolConns  int // connections in the Redis client's pools
}

func (u usage) String() string {
	return fmt.Sprintf("goroutines %d, fds %d (besides the Redis connections), Redis connections %d (in the pools %d)",
		u.goroutines, u.fds, u.redisConns, u.poolConns)
}

// measure reads the process's usage.
func (s *churnStack) measure(t *testing.T) usage {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := s.admin.ClientList(ctx).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	redisConns := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if line != "" && !strings.Contains(line, " cmd=client|list ") {
			redisConns++
		}
	}
	pool := poolConns(s.rdb)
	return usage{
		goroutines: runtime.NumGoroutine() - int(s.proxy.goroutines.Load()),
		fds:        len(ents) - int(s.proxy.sockets.Load()) - pool,
		redisConns: redisConns,
		poolConns:  pool,
	}
}

// poolConns is how many connections rdb's pools hold.
func poolConns(rdb *redis.Client) int {
	st := rdb.PoolStats()
	n := int(st.TotalConns)
	if st.PipelineStats != nil {
		n += int(st.PipelineStats.TotalConns)
	}
	return n
}

// baseline reads the usage of the process at rest for a second, and
// returns the least goroutines and file descriptors it saw.
func (s *churnStack) baseline(t *testing.T) usage {
	t.Helper()
	base := s.measure(t)
	for range 20 {
		time.Sleep(50 * time.Millisecond)
		u := s.measure(t)
		base.goroutines, base.fds = min(base.goroutines, u.goroutines), min(base.fds, u.fds)
	}
	return base
}

// settle waits, up to 20s, until the process's usage is back within a
// small margin of base, and the Redis connections within what the pools
// allow, and returns the last reading. The bound is not a measure of speed:
// the reading is expected to be there within a fraction of it. On failure
// it logs the goroutine profile, the file descriptors and the Redis
// connections.
func (s *churnStack) settle(t *testing.T, what string, base usage) usage {
	t.Helper()
	const goroutineMargin, fdMargin = 5, 4
	var u usage
	deadline := time.Now().Add(20 * time.Second)
	for {
		u = s.measure(t)
		ok := u.goroutines <= base.goroutines+goroutineMargin && u.fds <= base.fds+fdMargin &&
			u.poolConns <= churnMaxConns && u.redisConns <= churnMaxConns
		if ok {
			return u
		}
		if time.Now().After(deadline) {
			var buf bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
			t.Logf("goroutines:\n%s", buf.String())
			t.Logf("file descriptors:\n%s", describeFDs())
			list, _ := s.admin.ClientList(context.Background()).Result()
			t.Logf("Redis connections (the proxy holds %d):\n%s", s.proxy.Conns(), list)
			t.Fatalf("%s: %v 20s after the traffic stopped; baseline %v (margins: %d goroutines, %d fds; at most %d Redis connections)",
				what, u, base, goroutineMargin, fdMargin, churnMaxConns)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// describeFDs lists the process's open file descriptors, each socket with
// its TCP addresses.
func describeFDs() string {
	tcp := map[string]string{} // socket inode: local -> remote
	for _, f := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if fs := strings.Fields(line); len(fs) > 9 {
				tcp[fs[9]] = tcpPort(fs[1]) + " -> " + tcpPort(fs[2]) + " st " + fs[3]
			}
		}
	}
	ents, _ := os.ReadDir("/proc/self/fd")
	var out strings.Builder
	for _, e := range ents {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		if inode, ok := strings.CutPrefix(target, "socket:["); ok {
			target += " " + tcp[strings.TrimSuffix(inode, "]")]
		}
		fmt.Fprintf(&out, "%s %s\n", e.Name(), target)
	}
	return out.String()
}

// tcpPort is the port of an address of /proc/net/tcp ("0100007F:1F90").
func tcpPort(a string) string {
	_, port, _ := strings.Cut(a, ":")
	n, _ := strconv.ParseUint(port, 16, 16)
	return strconv.FormatUint(n, 10)
}

// heap is the live heap after a collection.
func heap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// effectCounter is a fake destination of irreversible effects: it counts the
// effects applied per operation id.
type effectCounter struct {
	mu      sync.Mutex
	applied map[string]int
}

func (d *effectCounter) apply(id string) {
	d.mu.Lock()
	d.applied[id]++
	d.mu.Unlock()
}

// twice lists the operations whose effect was applied more than once.
func (d *effectCounter) twice() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for id, n := range d.applied {
		if n > 1 {
			out = append(out, id+"×"+strconv.Itoa(n))
		}
	}
	return out
}

// TestNoLeaksUnderChurn drives ledgerd with bursts of hostile traffic:
// calls cancelled at random points, short deadlines, calls with a wrong API
// key, none, or over their tenant's rate, connections closed in the middle
// of calls, connections that send part of the HTTP/2 preface and hang up
// (or go silent, until the handshake timeout),
// and Redis replies stalled past the read timeout or cut by a TCP reset. After each burst ledgerd must be back to its baseline: goroutines,
// file descriptors, and Redis connections no more than its pools allow;
// its heap must not grow from burst to burst. Throughout, no operation's
// irreversible effect driven by client.Do is applied twice.
func TestNoLeaksUnderChurn(t *testing.T) {
	s := startChurnStack(t)
	dest := &effectCounter{applied: map[string]int{}}
	var total churnCounts
	run := func(burst int, d time.Duration) {
		c := &churn{s: s, dest: dest, burst: burst}
		c.run(t, d)
		t.Logf("burst %d: %d calls (%d answered), %d connections closed during calls, %d raw connections, %d client.Do calls (%d succeeded)",
			burst, c.calls.Load(), c.answered.Load(), c.closed.Load(), c.raw.Load(), c.dos.Load(), c.succeeded.Load())
		total.add(&c.churnCounts)
	}

	// Warm-up: what the process starts once (grpc-go's and go-redis's
	// lazily started goroutines, the pools) is in the baseline.
	run(0, 300*time.Millisecond)
	base := s.baseline(t)
	t.Logf("baseline: %v", base)

	const bursts = 3
	var heaps [bursts]uint64
	for b := range bursts {
		run(b+1, 2*time.Second)
		u := s.settle(t, "burst "+strconv.Itoa(b+1), base)
		heaps[b] = heap()
		t.Logf("after burst %d: %v; heap %d KiB", b+1, u, heaps[b]>>10)
	}
	// Growth from the first burst to the last: a few hundred bytes per call
	// would be more.
	const heapMargin = 2 << 20
	if heaps[bursts-1] > heaps[0]+heapMargin {
		t.Errorf("heap grew from %d KiB after burst 1 to %d KiB after burst %d", heaps[0]>>10, heaps[bursts-1]>>10, bursts)
	}
	if twice := dest.twice(); len(twice) > 0 {
		t.Errorf("effects applied more than once: %v", twice)
	}
	if total.answered.Load() == 0 || total.succeeded.Load() == 0 {
		t.Errorf("%d calls answered, %d client.Do calls succeeded: the churn tested nothing", total.answered.Load(), total.succeeded.Load())
	}
}

// churnCounts count a burst's traffic.
type churnCounts struct {
	calls     atomic.Int64 // calls of the service's methods
	answered  atomic.Int64 // ... that the service answered (not cut short)
	closed    atomic.Int64 // connections closed while their calls ran
	raw       atomic.Int64 // raw TCP connections
	dos       atomic.Int64 // client.Do calls
	succeeded atomic.Int64 // ... that returned a result
}

func (c *churnCounts) add(o *churnCounts) {
	c.calls.Add(o.calls.Load())
	c.answered.Add(o.answered.Load())
	c.closed.Add(o.closed.Load())
	c.raw.Add(o.raw.Load())
	c.dos.Add(o.dos.Load())
	c.succeeded.Add(o.succeeded.Load())
}

// churn is one burst of traffic.
type churn struct {
	s     *churnStack
	dest  *effectCounter
	burst int
	churnCounts
}

// run sends traffic for d from every kind of caller at once, with Redis
// disturbed meanwhile, and returns once every caller of the test has
// returned and the disturbance has ended.
func (c *churn) run(t *testing.T, d time.Duration) {
	t.Helper()
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var disturber sync.WaitGroup
	disturber.Add(1)
	go func() { defer disturber.Done(); c.disturbRedis(stop) }()
	// One shared connection, as an agent runtime holds.
	shared, err := c.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	var wg sync.WaitGroup
	for w := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(c.burst), uint64(w)))
			for round := 0; !stopped(); round++ {
				switch w % 6 {
				case 0, 1:
					c.rawCalls(r, shared, 10)
				case 2:
					c.closedMidCall(t, r)
				case 3:
					c.halfPrefaces(r, 5)
				case 4, 5:
					c.do(t, r, shared, w, round)
				}
			}
		}()
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	disturber.Wait()
}

// dial returns a new connection to the service.
func (c *churn) dial() (*grpc.ClientConn, error) {
	return grpc.NewClient(c.s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// disturbRedis stalls Redis's replies past the read timeout, or resets the
// connections, every little while until stop.
func (c *churn) disturbRedis(stop <-chan struct{}) {
	r := rand.New(rand.NewPCG(uint64(c.burst), 99))
	for {
		select {
		case <-stop:
			c.s.proxy.unstall()
			return
		case <-time.After(time.Duration(100+r.IntN(300)) * time.Millisecond):
		}
		if r.IntN(2) == 0 {
			c.s.proxy.reset()
			continue
		}
		c.s.proxy.stall()
		select {
		case <-stop:
		case <-time.After(churnReadTimeout + time.Duration(r.IntN(100))*time.Millisecond):
		}
		c.s.proxy.unstall()
	}
}

// callContext is a context for one call: none, cancelled a moment after
// the call goes out, a short deadline, or a comfortable one.
func callContext(r *rand.Rand) (context.Context, context.CancelFunc) {
	ctx := context.Background()
	switch r.IntN(4) {
	case 0:
		return context.WithCancel(ctx)
	case 1:
		ctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(moment(r), cancel)
		return ctx, cancel
	case 2:
		return context.WithTimeout(ctx, moment(r))
	default:
		return context.WithTimeout(ctx, 2*time.Second)
	}
}

// moment is a random delay from 10µs to 100ms, as likely within each tenfold
// range: the call may end while it is sent, queued, handled or answered,
// however fast the machine is.
func moment(r *rand.Rand) time.Duration {
	return time.Duration(10 * math.Pow(10, 4*r.Float64()) * float64(time.Microsecond))
}

// credentials adds an API key to ctx: mostly the agent's, sometimes the
// rate-limited tenant's, a wrong secret, or none.
func (c *churn) credentials(ctx context.Context, r *rand.Rand) context.Context {
	key := c.s.agent
	switch r.IntN(20) {
	case 0:
		return ctx
	case 1:
		key += "x"
	case 2, 3:
		key = c.s.limited
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
}

// withKey is a connection whose every call carries key.
type withKey struct {
	grpc.ClientConnInterface
	key string
}

func (w withKey) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+w.key)
	return w.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
}

// rawCalls makes n calls of every method on conn, each under callContext.
func (c *churn) rawCalls(r *rand.Rand, conn grpc.ClientConnInterface, n int) {
	for range n {
		c.oneCall(r, conn)
	}
}

// oneCall makes one call of a random method.
func (c *churn) oneCall(r *rand.Rand, cc grpc.ClientConnInterface) {
	lc := ledgerv1.NewLedgerServiceClient(cc)
	ctx, cancel := callContext(r)
	defer cancel()
	ctx = c.credentials(ctx, r)
	id := fmt.Sprintf("churn-raw-%d-%d", c.burst, r.IntN(200))
	var err error
	switch r.IntN(8) {
	case 0:
		params, _ := structpb.NewStruct(map[string]any{"n": float64(r.IntN(3))})
		var res *ledgerv1.ReserveResponse
		res, err = lc.Reserve(ctx, &ledgerv1.ReserveRequest{OperationId: id, Tool: "churn.raw", Params: params, Holder: newHolder()})
		if err == nil && res.GetDecision() == ledgerv1.Decision_DECISION_EXECUTE && r.IntN(2) == 0 {
			cctx, ccancel := callContext(r)
			_, _ = lc.Complete(c.credentials(cctx, r), &ledgerv1.CompleteRequest{OperationId: id, FencingToken: res.GetOperation().GetFencingToken(),
				Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: "r"}})
			ccancel()
		}
	case 1:
		_, err = lc.Complete(ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: uint64(1 + r.IntN(3)),
			Outcome: ledgerv1.Outcome_OUTCOME_FAILED_RETRYABLE, Failure: &ledgerv1.Failure{Code: "x"}})
	case 2:
		_, err = lc.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: id})
	case 3:
		_, err = lc.Renew(ctx, &ledgerv1.RenewRequest{OperationId: id, FencingToken: uint64(1 + r.IntN(3))})
	case 4:
		_, err = lc.Reconcile(ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_NOT_APPLIED})
	case 5:
		_, err = lc.MarkUnknown(ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: uint64(1 + r.IntN(3)), Reason: "lost"})
	case 6:
		// A method the service does not have.
		err = cc.Invoke(ctx, "/ledger.v1.LedgerService/Nope"+strconv.Itoa(r.IntN(1000)), &ledgerv1.LookupRequest{}, &ledgerv1.LookupResponse{})
	default:
		_, err = lc.ListUnresolved(ctx, &ledgerv1.ListUnresolvedRequest{PageSize: uint32(1 + r.IntN(50))})
	}
	c.calls.Add(1)
	switch status.Code(err) {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.Internal, codes.Unknown:
	default:
		c.answered.Add(1)
	}
}

// closedMidCall opens a connection, starts calls on it, and closes it while
// they run.
func (c *churn) closedMidCall(t *testing.T, r *rand.Rand) {
	conn, err := c.dial()
	if err != nil {
		t.Error(err)
		return
	}
	if r.IntN(2) == 0 {
		// Connected first, so that the calls reach the service before
		// the connection goes (otherwise it may go while it is made).
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn.Connect()
		for s := conn.GetState(); s != connectivity.Ready && conn.WaitForStateChange(ctx, s); s = conn.GetState() {
		}
		cancel()
	}
	var closing atomic.Bool
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		rg := rand.New(rand.NewPCG(r.Uint64(), uint64(g)))
		go func() {
			defer wg.Done()
			for i := 0; i < 3 && !closing.Load(); i++ {
				c.oneCall(rg, conn)
			}
		}()
	}
	// Streams that run until the connection goes: a health watch, and a
	// reflection stream left open after its first answer.
	sctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+c.s.agent)
	wg.Add(2)
	go func() {
		defer wg.Done()
		w, err := healthpb.NewHealthClient(conn).Watch(sctx, &healthpb.HealthCheckRequest{})
		for err == nil {
			_, err = w.Recv()
		}
	}()
	go func() {
		defer wg.Done()
		rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(sctx)
		if err == nil {
			err = rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
		}
		for err == nil {
			_, err = rs.Recv()
		}
	}()
	time.Sleep(moment(r))
	closing.Store(true)
	_ = conn.Close()
	c.closed.Add(1)
	wg.Wait()
}

// halfPrefaces opens n raw TCP connections that send part of the HTTP/2
// preface (or the preface and garbage) and hang up, or, one in four, go
// silent and wait for the server to hang up (its handshake timeout).
func (c *churn) halfPrefaces(r *rand.Rand, n int) {
	for range n {
		conn, err := net.Dial("tcp", c.s.addr)
		if err != nil {
			continue
		}
		c.raw.Add(1)
		switch r.IntN(4) {
		case 3:
			_, _ = conn.Write([]byte(h2test.Preface[:r.IntN(len(h2test.Preface))]))
			// Its socket and this goroutine are gone once the server
			// closes the connection: until then the baseline is not.
			go func() {
				_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
				_, _ = io.Copy(io.Discard, conn)
				_ = conn.Close()
			}()
			continue
		case 0:
			_, _ = conn.Write([]byte(h2test.Preface[:r.IntN(len(h2test.Preface))]))
		case 1:
			_, _ = conn.Write([]byte(h2test.Preface + "\xff\xff\xff garbage"))
		default:
			_, _ = conn.Write([]byte(h2test.Preface[:r.IntN(len(h2test.Preface))]))
			time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
		}
		if r.IntN(2) == 0 {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // hang up with a reset
			}
		}
		_ = conn.Close()
	}
}

// do drives four operations through client.Do, each from two callers at
// once, some of them cancelled on the way; their effects are counted at
// the destination.
func (c *churn) do(t *testing.T, r *rand.Rand, conn grpc.ClientConnInterface, worker, round int) {
	cl := client.New(withKey{conn, c.s.agent}, client.WithCallTimeout(300*time.Millisecond), client.WithReportTimeout(time.Second),
		client.WithBackoff(client.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond}),
		client.WithToolPolicy("churn.send", client.ToolPolicy{Timeout: 500 * time.Millisecond, MaxRetries: 2, Effect: client.EffectIrreversible}))
	var wg sync.WaitGroup
	for op := range 4 {
		id := fmt.Sprintf("churn-do-%d-%d-%d-%d", c.burst, worker, round, op)
		for range 2 {
			wg.Add(1)
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			if r.IntN(4) == 0 {
				time.AfterFunc(time.Duration(r.IntN(20))*time.Millisecond, cancel)
			}
			c.dos.Add(1)
			go func() {
				defer wg.Done()
				defer cancel()
				_, err := cl.Do(ctx, client.Op{ID: id, Tool: "churn.send", Params: map[string]any{"to": "x"}},
					func(ctx context.Context, a client.Attempt) (client.Result, error) {
						c.dest.apply(id)
						return client.Result{ResourceID: "sent-" + id}, nil
					})
				if err == nil {
					c.succeeded.Add(1)
				} else if errors.Is(err, client.ErrKeyReused) || errors.Is(err, client.ErrInvalidArgument) {
					t.Errorf("Do(%s): %v", id, err)
				}
			}()
		}
	}
	wg.Wait()
}

// TestShutdownWaitsForHandlers: when running calls outlast the shutdown
// timeout, Shutdown cancels them and returns only once their handlers have
// returned, so that ledgerd closes its Redis client under no handler.
func TestShutdownWaitsForHandlers(t *testing.T) {
	l, err := ledger.New(redistest.Shared(t).Client(t), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	var returned atomic.Bool
	// A handler that goes on working for a while after its call is
	// cancelled, as one waiting for Redis's reply does.
	slow := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod != ledgerv1.LedgerService_Lookup_FullMethodName {
			return h(ctx, req)
		}
		close(entered)
		<-ctx.Done()
		time.Sleep(200 * time.Millisecond)
		returned.Store(true)
		return nil, ctx.Err()
	}
	svc := server.New(server.Config{Ledger: l, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))},
		grpc.ChainUnaryInterceptor(slow))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	called := make(chan error, 1)
	go func() {
		_, err := ledgerv1.NewLedgerServiceClient(conn).Lookup(context.Background(), &ledgerv1.LookupRequest{OperationId: "op"})
		called <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	svc.Shutdown(ctx)
	if !returned.Load() {
		t.Fatal("Shutdown returned while a handler was still running")
	}
	// The caller learns that its call got no answer, and may repeat it.
	if err := <-called; status.Code(err) != codes.Unavailable {
		t.Fatalf("the cut call returned %v, want UNAVAILABLE", err)
	}
}

// churnProxy forwards TCP connections to a redis-server and lets a test
// disturb them: stall holds every reply (the requests still reach Redis)
// until unstall, and reset cuts every connection at once with a TCP reset.
// It counts the goroutines and sockets it holds, so that a test measuring
// the process can tell them from the ledger's.
type churnProxy struct {
	ln       net.Listener
	upstream string

	goroutines atomic.Int64 // copiers running
	sockets    atomic.Int64 // sockets open

	mu     sync.Mutex
	gate   chan struct{} // closed while replies flow; nil: they flow
	pairs  map[*proxyPair]struct{}
	closed bool
}

// A proxyPair is one proxied connection: the client's and Redis's sides.
type proxyPair struct {
	down, up net.Conn
	once     sync.Once
	done     chan struct{} // closed when either side ends
}

func (pp *proxyPair) end() { pp.once.Do(func() { close(pp.done) }) }

// newChurnProxy starts a proxy to upstream on a free loopback port, and stops
// it (cutting every connection) at the test's end.
func newChurnProxy(t testing.TB, upstream string) *churnProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &churnProxy{ln: ln, upstream: upstream, pairs: map[*proxyPair]struct{}{}}
	p.goroutines.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Addr is the address clients dial.
func (p *churnProxy) Addr() string { return p.ln.Addr().String() }

// Conns is how many proxied connections are open.
func (p *churnProxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pairs)
}

// stall holds every reply, on open and new connections, until unstall.
func (p *churnProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate == nil {
		p.gate = make(chan struct{})
	}
}

// unstall lets the held replies through.
func (p *churnProxy) unstall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

// reset cuts every open connection with a TCP reset.
func (p *churnProxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pp := range p.pairs {
		if tc, ok := pp.down.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = pp.down.Close()
		_ = pp.up.Close()
		pp.end()
	}
}

func (p *churnProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.unstall()
	p.reset()
}

func (p *churnProxy) serve() {
	defer p.goroutines.Add(-1)
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.sockets.Add(1)
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = down.Close()
			p.sockets.Add(-1)
			continue
		}
		p.sockets.Add(1)
		pp := &proxyPair{down: down, up: up, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_, _ = down.Close(), up.Close()
			p.sockets.Add(-2)
			return
		}
		p.pairs[pp] = struct{}{}
		p.mu.Unlock()
		var copiers sync.WaitGroup
		copiers.Add(2)
		p.goroutines.Add(3)
		go func() {
			defer p.goroutines.Add(-1)
			defer copiers.Done()
			// Through plain readers and writers: io.Copy between two TCP
			// connections would splice through pipes that the runtime
			// caches, file descriptors the test would count.
			_, _ = io.Copy(struct{ io.Writer }{up}, struct{ io.Reader }{down})
			pp.end()
		}()
		go func() {
			defer p.goroutines.Add(-1)
			defer copiers.Done()
			p.replies(pp)
			pp.end()
		}()
		go func() {
			// Whichever side ends first ends the pair: a client that closes
			// its connection (a read timeout) drops Redis's side too.
			defer p.goroutines.Add(-1)
			<-pp.done
			_, _ = down.Close(), up.Close()
			copiers.Wait()
			p.mu.Lock()
			delete(p.pairs, pp)
			p.mu.Unlock()
			p.sockets.Add(-2)
		}()
	}
}

// replies copies Redis's replies to the client, waiting while the proxy
// stalls.
func (p *churnProxy) replies(pp *proxyPair) {
	buf := make([]byte, 32<<10)
	for {
		n, err := pp.up.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			if gate != nil {
				select {
				case <-gate:
				case <-pp.done:
					return
				}
			}
			if _, werr := pp.down.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
