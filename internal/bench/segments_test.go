package bench

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/opledger/ledger/server"
)

// segmentClock records when the server saw the parts of the latest call: a
// gRPC stats handler (the call's start and its request and reply messages)
// and the innermost interceptor (the handler).
type segmentClock struct {
	mu                     sync.Mutex
	begin, in, out         time.Time
	handlerIn, handlerDone time.Time
}

func (c *segmentClock) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (c *segmentClock) HandleRPC(_ context.Context, s stats.RPCStats) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch s.(type) {
	case *stats.Begin:
		c.begin = now
	case *stats.InPayload:
		c.in = now
	case *stats.OutPayload:
		c.out = now
	}
}

func (c *segmentClock) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (c *segmentClock) HandleConn(context.Context, stats.ConnStats) {}

func (c *segmentClock) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	c.mu.Lock()
	c.handlerIn = time.Now()
	c.mu.Unlock()
	res, err := h(ctx, req)
	c.mu.Lock()
	c.handlerDone = time.Now()
	c.mu.Unlock()
	return res, err
}

// BenchmarkSegments splits a call at concurrency 1, client and service in
// one process (Redis outside), into the segments the server can see, and
// reports the median of each in µs: from the client's call to the server
// seeing it (call→begin), to its request message (begin→request), to the
// ledger handler's start and end (request→handler, handler; health Check
// has no ledger handler), to the reply message (handler→reply), and back in
// the client (reply→client). docs/benchmarks.md §5.2:
//
//	go test -run '^$' -bench Segments -benchtime 5000x ./internal/bench
func BenchmarkSegments(b *testing.B) {
	_, l := benchLedger(b)
	clock := &segmentClock{}
	svc := server.New(server.Config{Ledger: l, Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))},
		grpc.StatsHandler(clock), grpc.ChainUnaryInterceptor(clock.intercept))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	b.Cleanup(svc.GRPC.Stop)
	t, err := Dial(lis.Addr().String(), 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(t.Close)
	run := RunID()
	for _, c := range []struct {
		name   string
		call   Call
		ledger bool
	}{{"health", t.Health(), false}, {"Reserve", t.ReserveNew(run), true}} {
		b.Run(c.name, func(b *testing.B) {
			names := []string{"call→begin", "begin→request", "request→handler", "handler", "handler→reply", "reply→client"}
			segs := make([][]float64, len(names))
			var seq int64
			for b.Loop() {
				seq++
				start := time.Now()
				if err := c.call(context.Background(), seq); err != nil {
					b.Fatal(err)
				}
				done := time.Now()
				clock.mu.Lock()
				hIn, hDone := clock.handlerIn, clock.handlerDone
				if !c.ledger {
					hIn, hDone = clock.in, clock.in
				}
				for i, d := range []time.Duration{
					clock.begin.Sub(start), clock.in.Sub(clock.begin), hIn.Sub(clock.in),
					hDone.Sub(hIn), clock.out.Sub(hDone), done.Sub(clock.out),
				} {
					segs[i] = append(segs[i], float64(d)/1e3)
				}
				clock.mu.Unlock()
			}
			for i, s := range segs {
				slices.Sort(s)
				b.ReportMetric(s[len(s)/2], "µs-"+names[i])
			}
		})
	}
}
