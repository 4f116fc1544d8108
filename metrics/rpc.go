package metrics

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rpcMetrics are the gRPC server metrics of go-grpc-middleware's Prometheus
// provider (grpc_server_started_total, grpc_server_handled_total,
// grpc_server_msg_received_total, grpc_server_msg_sent_total and
// grpc_server_handling_seconds, with its names, help, labels and buckets,
// counted at the same points: TestRPCMetricsMatchProvider), recorded by
// the service itself so that each method's series are found once instead
// of by their label values in five vectors on every call.
type rpcMetrics struct {
	started, handled, received, sent *prometheus.CounterVec
	handling                         *prometheus.HistogramVec

	methods sync.Map // full method name -> *rpcSeries
}

func newRPCMetrics() *rpcMetrics {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	return &rpcMetrics{
		started: counter("grpc_server_started_total", "Total number of RPCs started on the server.", labels),
		handled: counter("grpc_server_handled_total", "Total number of RPCs completed on the server, regardless of success or failure.",
			[]string{"grpc_type", "grpc_service", "grpc_method", "grpc_code"}),
		received: counter("grpc_server_msg_received_total", "Total number of RPC stream messages received on the server.", labels),
		sent:     counter("grpc_server_msg_sent_total", "Total number of gRPC stream messages sent by the server.", labels),
		handling: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "grpc_server_handling_seconds",
			Help:    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			Buckets: prometheus.DefBuckets,
		}, labels),
	}
}

// Describe implements prometheus.Collector.
func (r *rpcMetrics) Describe(ch chan<- *prometheus.Desc) {
	r.started.Describe(ch)
	r.handled.Describe(ch)
	r.received.Describe(ch)
	r.sent.Describe(ch)
	r.handling.Describe(ch)
}

// Collect implements prometheus.Collector.
func (r *rpcMetrics) Collect(ch chan<- prometheus.Metric) {
	r.started.Collect(ch)
	r.handled.Collect(ch)
	r.received.Collect(ch)
	r.sent.Collect(ch)
	r.handling.Collect(ch)
}

// rpcSeries are one method's series. The handled counters are found on
// their method's first call with each code (all codes, when initialized).
type rpcSeries struct {
	labels                  [3]string // type, service, method
	started, received, sent prometheus.Counter
	handling                prometheus.Observer
	handled                 [codes.Unauthenticated + 1]atomic.Pointer[prometheus.Counter]
	vec                     *prometheus.CounterVec
}

// series returns the series of a method, of the given type ("unary",
// "server_stream", ...).
func (r *rpcMetrics) series(fullMethod, typ string) *rpcSeries {
	if s, ok := r.methods.Load(fullMethod); ok {
		return s.(*rpcSeries)
	}
	service, method := "unknown", "unknown"
	if name := strings.TrimPrefix(fullMethod, "/"); strings.Contains(name, "/") {
		service, method, _ = strings.Cut(name, "/")
	}
	s := &rpcSeries{labels: [3]string{typ, service, method}, vec: r.handled}
	s.started = r.started.WithLabelValues(s.labels[:]...)
	s.received = r.received.WithLabelValues(s.labels[:]...)
	s.sent = r.sent.WithLabelValues(s.labels[:]...)
	s.handling = r.handling.WithLabelValues(s.labels[:]...)
	actual, _ := r.methods.LoadOrStore(fullMethod, s)
	return actual.(*rpcSeries)
}

// handledCounter is the method's grpc_server_handled_total series for code.
func (s *rpcSeries) handledCounter(code codes.Code) prometheus.Counter {
	if int(code) >= len(s.handled) {
		return s.vec.WithLabelValues(s.labels[0], s.labels[1], s.labels[2], code.String())
	}
	if c := s.handled[code].Load(); c != nil {
		return *c
	}
	c := s.vec.WithLabelValues(s.labels[0], s.labels[1], s.labels[2], code.String())
	s.handled[code].Store(&c)
	return c
}

// done counts a finished call.
func (s *rpcSeries) done(err error, start time.Time) {
	s.handledCounter(rpcCode(err)).Inc()
	s.handling.Observe(time.Since(start).Seconds())
}

// rpcCode is the code a call ended with, as the provider reads it: a
// context error that is not a status counts as Canceled or
// DeadlineExceeded.
func rpcCode(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return status.FromContextError(err).Code()
}

func (r *rpcMetrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	s := r.series(info.FullMethod, "unary")
	s.started.Inc()
	s.received.Inc()
	resp, err := handler(ctx, req)
	if err == nil {
		s.sent.Inc()
	}
	s.done(err, start)
	return resp, err
}

func (r *rpcMetrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	s := r.series(info.FullMethod, streamKind(info.IsClientStream, info.IsServerStream))
	s.started.Inc()
	err := handler(srv, &countedStream{ServerStream: ss, s: s})
	s.done(err, start)
	return err
}

// streamKind is a method's grpc_type label.
func streamKind(clientStream, serverStream bool) string {
	switch {
	case clientStream && serverStream:
		return "bidi_stream"
	case clientStream:
		return "client_stream"
	case serverStream:
		return "server_stream"
	}
	return "unary"
}

// countedStream counts the messages a stream sends and receives.
type countedStream struct {
	grpc.ServerStream
	s *rpcSeries
}

func (c *countedStream) SendMsg(m any) error {
	err := c.ServerStream.SendMsg(m)
	if err == nil {
		c.s.sent.Inc()
	}
	return err
}

func (c *countedStream) RecvMsg(m any) error {
	err := c.ServerStream.RecvMsg(m)
	if err == nil {
		c.s.received.Inc()
	}
	return err
}

// initialize creates the series of every method s serves, every code
// included, at zero.
func (r *rpcMetrics) initialize(s *grpc.Server) {
	for service, info := range s.GetServiceInfo() {
		for _, m := range info.Methods {
			series := r.series("/"+service+"/"+m.Name, streamKind(m.IsClientStream, m.IsServerStream))
			for c := range series.handled {
				series.handledCounter(codes.Code(c))
			}
		}
	}
}
