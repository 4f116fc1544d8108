package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/metrics"
	"github.com/opledger/ledger/server"
)

// scrapeRPC returns the value of the RPC metric name of method of
// ledger.v1.LedgerService (grpc_code too when code is not empty), from a
// scrape of m.
func scrapeRPC(t *testing.T, m *metrics.Metrics, name, method, code string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if !strings.HasPrefix(l, name+"{") || !strings.Contains(l, `grpc_method="`+method+`"`) ||
			!strings.Contains(l, `grpc_service="ledger.v1.LedgerService"`) {
			continue
		}
		if code == "" || strings.Contains(l, `grpc_code="`+code+`"`) {
			return l[strings.LastIndexByte(l, ' ')+1:]
		}
	}
	return "absent"
}

// TestRPCMetricsCountEveryCall: grpc_server_started_total and
// grpc_server_handled_total count the calls that authentication, the scope
// check or the rate limit refuse, and those that panic, not only the calls
// that reach a handler.
func TestRPCMetricsCountEveryCall(t *testing.T) {
	kr := newKeyring(t)
	key := kr.add(t, "acme", "acme", "agent", false)
	viewer := kr.add(t, "acme-viewer", "acme", "viewer", false)
	met := metrics.New(metrics.Options{})
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{Rate: 0.01, Burst: 1}, ledger.Options{}, met.ServerOptions())
	lookup := &ledgerv1.LookupRequest{OperationId: "metrics-" + randomHex(4)}
	if _, err := e.c.Lookup(context.Background(), lookup); codeOf(err) != codes.Unauthenticated {
		t.Fatalf("without credentials: %v", err)
	}
	if _, err := e.c.Reserve(as(viewer), reserveReq("metrics-"+randomHex(4), "payments.refund", nil, newHolder())); codeOf(err) != codes.PermissionDenied {
		t.Fatalf("Reserve with a viewer's key: %v", err)
	}
	if _, err := e.c.Lookup(as(key), lookup); codeOf(err) != codes.NotFound {
		t.Fatalf("Lookup within the burst: %v", err)
	}
	if _, err := e.c.Lookup(as(key), lookup); codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("Lookup over the rate: %v", err)
	}
	for _, c := range []struct{ name, method, code, want string }{
		{"grpc_server_started_total", "Lookup", "", "3"},
		{"grpc_server_handled_total", "Lookup", "Unauthenticated", "1"},
		{"grpc_server_handled_total", "Lookup", "NotFound", "1"},
		{"grpc_server_handled_total", "Lookup", "ResourceExhausted", "1"},
		{"grpc_server_started_total", "Reserve", "", "1"},
		{"grpc_server_handled_total", "Reserve", "PermissionDenied", "1"},
	} {
		if got := scrapeRPC(t, met, c.name, c.method, c.code); got != c.want {
			t.Errorf("%s{grpc_method=%q, grpc_code=%q} = %s, want %s", c.name, c.method, c.code, got, c.want)
		}
	}

	// A handler that panics (here: no ledger behind the service) is
	// counted as INTERNAL, the status the caller gets.
	met = metrics.New(metrics.Options{})
	svc := server.New(server.Config{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}, met.ServerOptions()...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	t.Cleanup(svc.GRPC.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := ledgerv1.NewLedgerServiceClient(conn).Lookup(context.Background(), lookup); codeOf(err) != codes.Internal {
		t.Fatalf("Lookup that panics: %v", err)
	}
	if got := scrapeRPC(t, met, "grpc_server_handled_total", "Lookup", "Internal"); got != "1" {
		t.Errorf("grpc_server_handled_total of a panic = %s, want 1", got)
	}
}
