package server

import (
	"log/slog"
	"strconv"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// healthWatch is the method whose streams watchGate bounds.
const healthWatch = "/" + healthService + "/Watch"

// HealthWatchStats counts a Service's health Watch streams.
type HealthWatchStats struct {
	// Open is the Watch streams running now.
	Open int
	// Refused is the Watch calls refused since the start for being over
	// ConnectionLimits.MaxHealthWatches.
	Refused uint64
}

// watchGate counts the health Watch streams of a Service, and refuses those
// over its limit.
type watchGate struct {
	max   int64 // no bound when 0
	log   *slog.Logger
	lines logEvery // of the refusals

	open    atomic.Int64
	refused atomic.Uint64
}

// stats returns the counts.
func (g *watchGate) stats() HealthWatchStats {
	return HealthWatchStats{Open: int(g.open.Load()), Refused: g.refused.Load()}
}

// interceptor counts the Watch streams while they run, and answers one over
// the limit with RESOURCE_EXHAUSTED at once, before its handler (and before
// the call log: refusals are logged at most once every refusalLogEvery,
// each line with the count since the previous one). Other calls pass.
func (g *watchGate) interceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != healthWatch {
		return handler(srv, ss)
	}
	if n := g.open.Add(1); g.max > 0 && n > g.max {
		g.open.Add(-1)
		g.refused.Add(1)
		if n, due := g.lines.note(); due {
			g.log.Warn("health watches refused: the server holds its maximum of health Watch streams",
				"max_health_watches", g.max, "refused", n)
		}
		return status.Error(codes.ResourceExhausted, "the server holds its maximum of "+strconv.FormatInt(g.max, 10)+
			" health Watch streams: call Check, or Watch again later")
	}
	defer g.open.Add(-1)
	return handler(srv, ss)
}
