package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The call log: one JSON line per finished call, "finished call", with the
// fields go-grpc-middleware's logging interceptor writes (protocol,
// grpc.component, grpc.service, grpc.method, grpc.method_type,
// peer.address, grpc.start_time, grpc.request.deadline, grpc.code,
// grpc.error, grpc.time_ms), in its order and at its levels (codeLevel),
// and the ledger's fields (ledger.operation_id, ledger.state, ...) that
// the interceptors and handlers add with addLog.
//
// Unlike the middleware, it builds the line only when the logger will
// write it: a call adds its ledger fields to a small per-call buffer, and
// the common fields, the timestamps and the duration are formatted at the
// end, after the level is known. At --log-level warn a successful call
// costs two allocations here (its buffer and its context) instead of a
// dozen field copies (docs/benchmarks.md §6.5).
//
// Calls refused for missing or bad credentials (UNAUTHENTICATED) come from
// anyone who can reach the port, as fast as it sends them: they write at
// most one line every refusalLogEvery, which counts those since the
// previous one that wrote none (ledger.unlogged_refusals), as refused
// connections are logged.

type callLogKey struct{}

// callLog is one call's ledger fields, in the order they were added.
type callLog struct {
	mu    sync.Mutex
	attrs []slog.Attr
	buf   [10]slog.Attr
}

// addLog adds fields to the log line of the call ctx belongs to; a field
// whose key is already there replaces it. Outside a call it does nothing.
func addLog(ctx context.Context, attrs ...slog.Attr) {
	cl, _ := ctx.Value(callLogKey{}).(*callLog)
	if cl == nil {
		return
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.attrs == nil {
		cl.attrs = cl.buf[:0]
	}
next:
	for _, a := range attrs {
		for i := range cl.attrs {
			if cl.attrs[i].Key == a.Key {
				cl.attrs[i] = a
				continue next
			}
		}
		cl.attrs = append(cl.attrs, a)
	}
}

// callLoggers returns the interceptors that write the call log to log,
// with the lines of calls refused for their credentials spaced by
// refusals.
func callLoggers(log *slog.Logger, refusals *logEvery) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		cl := new(callLog)
		resp, err := handler(context.WithValue(ctx, callLogKey{}, cl), req)
		writeCallLog(ctx, log, refusals, info.FullMethod, "unary", start, cl, err)
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		cl := new(callLog)
		ctx := ss.Context()
		err := handler(srv, &loggedStream{ServerStream: ss, ctx: context.WithValue(ctx, callLogKey{}, cl)})
		writeCallLog(ctx, log, refusals, info.FullMethod, streamType(info), start, cl, err)
		return err
	}
	return unary, stream
}

// loggedStream gives a streaming handler the context with the call log.
type loggedStream struct {
	grpc.ServerStream
	ctx context.Context
}

// Context returns the stream's context with its call log.
func (s *loggedStream) Context() context.Context { return s.ctx }

func streamType(info *grpc.StreamServerInfo) string {
	switch {
	case info.IsClientStream && info.IsServerStream:
		return "bidi_stream"
	case info.IsClientStream:
		return "client_stream"
	default:
		return "server_stream"
	}
}

// codeLevel is the level of a call's line by its code: the middleware's
// default for servers (logging.DefaultServerCodeToLevel).
func codeLevel(c codes.Code) slog.Level {
	switch c {
	case codes.OK, codes.NotFound, codes.Canceled, codes.AlreadyExists, codes.InvalidArgument, codes.Unauthenticated:
		return slog.LevelInfo
	case codes.DeadlineExceeded, codes.PermissionDenied, codes.ResourceExhausted, codes.FailedPrecondition,
		codes.Aborted, codes.OutOfRange, codes.Unavailable:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

// writeCallLog writes the line of a call that started at start and ended
// with err, if log is enabled at the line's level; for a call refused for
// its credentials, only when refusals lets it through.
func writeCallLog(ctx context.Context, log *slog.Logger, refusals *logEvery, fullMethod, typ string, start time.Time, cl *callLog, err error) {
	if errors.Is(err, io.EOF) {
		err = nil
	}
	code := status.Code(err)
	level := codeLevel(code)
	if !log.Enabled(ctx, level) {
		return
	}
	var unlogged uint64
	if code == codes.Unauthenticated && refusals != nil {
		n, due := refusals.note()
		if !due {
			return
		}
		unlogged = n - 1
	}
	took := time.Since(start)
	service, method := splitMethod(fullMethod)
	cl.mu.Lock()
	attrs := make([]slog.Attr, 0, 13+len(cl.attrs))
	attrs = append(attrs,
		slog.String("protocol", "grpc"),
		slog.String("grpc.component", "server"),
		slog.String("grpc.service", service),
		slog.String("grpc.method", method),
		slog.String("grpc.method_type", typ))
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, slog.String("peer.address", p.Addr.String()))
	}
	attrs = append(attrs, slog.String("grpc.start_time", start.Format(time.RFC3339)))
	if d, ok := ctx.Deadline(); ok {
		attrs = append(attrs, slog.String("grpc.request.deadline", d.Format(time.RFC3339)))
	}
	attrs = append(attrs, cl.attrs...)
	cl.mu.Unlock()
	attrs = append(attrs, slog.String("grpc.code", code.String()))
	if err != nil {
		attrs = append(attrs, slog.String("grpc.error", loggedError(err)))
		if r := errorReason(err); r != "" {
			attrs = append(attrs, slog.String("ledger.reason", r))
		}
		if code == codes.Unauthenticated && refusals != nil {
			attrs = append(attrs, slog.Uint64("ledger.unlogged_refusals", unlogged))
		}
	}
	ms := float32(took.Nanoseconds()/1000) / 1000
	attrs = append(attrs, slog.String("grpc.time_ms", strconv.FormatFloat(float64(ms), 'f', -1, 32)))
	log.LogAttrs(ctx, level, "finished call", attrs...)
}

// loggedError is err as the call log shows it. A refused request's error
// names only the refused fields there: its descriptions, which the caller
// gets, may quote the request's own data (the member names of its
// parameters, on the way to a bad value).
func loggedError(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		br, ok := d.(*errdetails.BadRequest)
		if !ok {
			continue
		}
		var fields []string
		for _, v := range br.GetFieldViolations() {
			if !slices.Contains(fields, v.GetField()) {
				fields = append(fields, v.GetField())
			}
		}
		return "rpc error: code = " + st.Code().String() + " desc = invalid request: " + strings.Join(fields, ", ")
	}
	return err.Error()
}
