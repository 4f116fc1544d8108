package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

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
	conn := dialConn(t, serveLoopback(t, svc))
	if _, err := ledgerv1.NewLedgerServiceClient(conn).Lookup(context.Background(), lookup); codeOf(err) != codes.Internal {
		t.Fatalf("Lookup that panics: %v", err)
	}
	if got := scrapeRPC(t, met, "grpc_server_handled_total", "Lookup", "Internal"); got != "1" {
		t.Errorf("grpc_server_handled_total of a panic = %s, want 1", got)
	}
}

// TestMetricsHoldNoSecretsParamsOrResults: contract.md §8: after calls with
// parameters, results, failures, notes and credentials, a scrape of every
// metric (the RPCs' and the ledger's, with the tenant label on) holds none
// of them.
func TestMetricsHoldNoSecretsParamsOrResults(t *testing.T) {
	kr := newKeyring(t)
	tenant := "metrics-" + randomHex(4)
	key := kr.add(t, "metrics-agent", tenant, "reconciler", false)
	met := metrics.New(metrics.Options{TenantLabel: true})
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{}, ledger.Options{Observer: met.Observe}, met.ServerOptions())
	id := "metrics-" + randomHex(4)
	params := mustStruct(t, map[string]any{"card": "4111-SECRET-PARAM", "memo": "PRIVATE-MEMO-77"})
	r, err := e.c.Reserve(as(key), reserveReq(id, "payments.charge", params, newHolder()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.MarkUnknown(as(key), &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: r.Operation.FencingToken, Reason: "NOTE-REASON-12"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Reconcile(as(key), &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_APPLIED, Note: "NOTE-FINDING-34",
		Result: &ledgerv1.Result{ResourceId: "RESOURCE-ID-31", Data: mustStruct(t, map[string]any{"receipt": "RESULT-DATA-5521"})}}); err != nil {
		t.Fatal(err)
	}
	other := "metrics-" + randomHex(4)
	r, err = e.c.Reserve(as(key), reserveReq(other, "payments.charge", params, newHolder()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Complete(as(key), &ledgerv1.CompleteRequest{OperationId: other, FencingToken: r.Operation.FencingToken,
		Outcome: ledgerv1.Outcome_OUTCOME_FAILED_FINAL, Failure: &ledgerv1.Failure{Code: "FAILURE-CODE-9", Message: "FAILURE-MESSAGE-88"}}); err != nil {
		t.Fatal(err)
	}
	_, _ = e.c.Reserve(as(key), reserveReq(id, "payments.charge", mustStruct(t, map[string]any{"card": "OTHER-SECRET-CARD"}), newHolder()))
	_, _ = e.c.Lookup(as("metrics-agent."+strings.Repeat("f", 64)), &ledgerv1.LookupRequest{OperationId: id})

	rec := httptest.NewRecorder()
	met.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	scrape := rec.Body.String()
	_, secret, _ := strings.Cut(key, ".")
	for _, s := range []string{"4111-SECRET-PARAM", "PRIVATE-MEMO-77", "OTHER-SECRET-CARD", "RESULT-DATA-5521", "RESOURCE-ID-31",
		"FAILURE-CODE-9", "FAILURE-MESSAGE-88", "NOTE-REASON-12", "NOTE-FINDING-34", secret, strings.Repeat("f", 64)} {
		if strings.Contains(scrape, s) {
			t.Errorf("the metrics hold %q", s)
		}
	}
	// Not an empty scrape: the calls and the tenant are there.
	if !strings.Contains(scrape, `grpc_method="Reconcile"`) || !strings.Contains(scrape, tenant) {
		t.Fatalf("the scrape lacks the calls or the tenant:\n%s", scrape)
	}
}
