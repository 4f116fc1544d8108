package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// TestRPCMetricsMatchProvider runs the same calls through the service's RPC
// metrics and go-grpc-middleware's Prometheus provider (with its handling
// time histogram, as ledgerd had it), side by side on one server, and
// requires the same metrics from both: names, help, types, label sets,
// counts, histogram buckets; before any call (zero-initialized) and after
// unary calls that succeed, fail with a status, with a context error and
// with a plain error, a server stream cancelled by its client and a bidi
// stream.
func TestRPCMetricsMatchProvider(t *testing.T) {
	ours, theirs := newRPCMetrics(), grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	regOurs, regTheirs := prometheus.NewRegistry(), prometheus.NewRegistry()
	regOurs.MustRegister(ours)
	regTheirs.MustRegister(theirs)

	// Innermost: the errors a handler may return without a status.
	failures := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch req.(*healthpb.HealthCheckRequest).GetService() {
		case "deadline":
			return nil, context.DeadlineExceeded
		case "canceled":
			return nil, context.Canceled
		case "plain":
			return nil, errors.New("not a status")
		case "wrapped":
			return nil, errors.Join(errors.New("context"), status.Error(codes.Aborted, "aborted"))
		}
		return handler(ctx, req)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(ours.unary, theirs.UnaryServerInterceptor(), failures),
		grpc.ChainStreamInterceptor(ours.stream, theirs.StreamServerInterceptor()),
	)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	ours.initialize(srv)
	theirs.InitializeMetrics(srv)
	sameMetrics(t, regOurs, regTheirs)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"", "", "missing", "deadline", "canceled", "plain", "wrapped"} {
		_, _ = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
	}
	wctx, wcancel := context.WithCancel(ctx)
	w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	wcancel()
	rc, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		if _, err := rc.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rc.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Recv(); err != io.EOF {
		t.Fatalf("reflection stream: %v", err)
	}
	// The server sees the cancelled Watch end on its own time.
	deadline := time.Now().Add(5 * time.Second)
	for !watchEnded(t, regOurs) || !watchEnded(t, regTheirs) {
		if time.Now().After(deadline) {
			t.Fatal("the cancelled Watch never ended on the server")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sameMetrics(t, regOurs, regTheirs)
	if got := counterValue(t, regOurs, "grpc_server_handled_total", "Check", "OK"); got != 2 {
		t.Fatalf("Check OK counted %v times, want 2", got)
	}
}

func watchEnded(t *testing.T, reg *prometheus.Registry) bool {
	return counterValue(t, reg, "grpc_server_handled_total", "Watch", "Canceled") == 1
}

func counterValue(t *testing.T, reg *prometheus.Registry, family, method, code string) float64 {
	t.Helper()
	return seriesValue(t, reg, family, map[string]string{"grpc_method": method, "grpc_code": code})
}

func labelMap(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// sameMetrics compares two registries' metrics, histograms by their sample
// counts and bucket bounds (the times themselves differ).
func sameMetrics(t *testing.T, ours, theirs *prometheus.Registry) {
	t.Helper()
	flatten := func(reg *prometheus.Registry) []string {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range fams {
			out = append(out, "# "+f.GetName()+" "+f.GetType().String()+" "+f.GetHelp())
			for _, m := range f.GetMetric() {
				var labels []string
				for _, p := range m.GetLabel() {
					labels = append(labels, p.GetName()+"="+p.GetValue())
				}
				line := f.GetName() + "{" + strings.Join(labels, ",") + "} "
				switch {
				case m.GetCounter() != nil:
					line += prometheusValue(m.GetCounter().GetValue())
				case m.GetHistogram() != nil:
					h := m.GetHistogram()
					line += "count=" + prometheusValue(float64(h.GetSampleCount())) + " buckets="
					for _, b := range h.GetBucket() {
						line += prometheusValue(b.GetUpperBound()) + ","
					}
				default:
					t.Fatalf("unexpected metric type in %s", f.GetName())
				}
				out = append(out, line)
			}
		}
		sort.Strings(out)
		return out
	}
	a, b := flatten(ours), flatten(theirs)
	if strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Fatalf("the service's RPC metrics:\n%s\n\ngo-grpc-middleware's:\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
	if len(a) < 50 {
		t.Fatalf("only %d lines: the comparison saw no series", len(a))
	}
}

func prometheusValue(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// BenchmarkRPCMetrics: what recording one unary call's RPC metrics costs,
// the service's against go-grpc-middleware's provider.
//
//	go test -run '^$' -bench RPCMetrics -benchmem ./metrics
func BenchmarkRPCMetrics(b *testing.B) {
	info := &grpc.UnaryServerInfo{FullMethod: "/ledger.v1.LedgerService/Reserve"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	ctx := context.Background()
	b.Run("service", func(b *testing.B) {
		r := newRPCMetrics()
		for b.Loop() {
			_, _ = r.unary(ctx, nil, info, handler)
		}
	})
	b.Run("go-grpc-middleware", func(b *testing.B) {
		i := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram()).UnaryServerInterceptor()
		for b.Loop() {
			_, _ = i(ctx, nil, info, handler)
		}
	})
}
