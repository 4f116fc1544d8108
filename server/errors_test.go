package server_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/server"
)

// TestErrorsCarryTheContractsDetails checks every reason of contract.md §5 on the
// wire: code, ErrorInfo (domain ledger.v1) and the detail it comes with.
func TestErrorsCarryTheContractsDetails(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		params := mustStruct(t, map[string]any{"amount": 1})
		_, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: e.id("never")})
		wantReason(t, err, codes.NotFound, "NOT_FOUND")

		live, err := e.c.Reserve(e.ctx, reserveReq(e.id("live"), "payments.refund", params, newHolder()))
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: e.id("live"), Finding: ledgerv1.Finding_FINDING_APPLIED})
		wantReason(t, err, codes.FailedPrecondition, "OPERATION_IN_PROGRESS")
		if !hasRetryInfo(err) {
			t.Fatal("OPERATION_IN_PROGRESS without RetryInfo")
		}
		_, err = e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: e.id("live"), FencingToken: live.Operation.FencingToken - 1, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED})
		wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN")
		if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: e.id("live"), FencingToken: live.Operation.FencingToken, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED}); err != nil {
			t.Fatal(err)
		}
		_, err = e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: e.id("live"), FencingToken: live.Operation.FencingToken, Outcome: ledgerv1.Outcome_OUTCOME_FAILED_FINAL})
		wantReason(t, err, codes.FailedPrecondition, "COMPLETION_CONFLICT")
		_, err = e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: e.id("live"), Finding: ledgerv1.Finding_FINDING_ABANDON})
		wantReason(t, err, codes.FailedPrecondition, "ALREADY_RESOLVED")

		tiny, err := e.c.Reserve(e.ctx, reserveReq(e.id("tiny"), "tiny.refund", params, newHolder()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: e.id("tiny"), FencingToken: tiny.Operation.FencingToken, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err = e.c.Reserve(e.ctx, reserveReq(e.id("tiny"), "tiny.refund", params, newHolder()))
			if err != nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_EXPIRED")
		if ei.Metadata["final_state"] != "STATE_SUCCEEDED" {
			t.Fatalf("final_state = %q", ei.Metadata["final_state"])
		}
	})
}

// TestPanicIsInternalWithTheContractsDetails: contract.md §5 gives every error an
// ErrorInfo, also the one of a handler that panics (here: a service with no
// ledger behind it): INTERNAL, reason INTERNAL, domain ledger.v1.
func TestPanicIsInternalWithTheContractsDetails(t *testing.T) {
	svc := server.New(server.Config{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	conn := dialConn(t, serveLoopback(t, svc))
	_, err := ledgerv1.NewLedgerServiceClient(conn).Lookup(context.Background(), &ledgerv1.LookupRequest{OperationId: "panics"})
	wantReason(t, err, codes.Internal, "INTERNAL")
}

func hasRetryInfo(err error) bool {
	for _, d := range statusDetails(err) {
		if strings.HasSuffix(string(d.ProtoReflect().Descriptor().FullName()), "RetryInfo") {
			return true
		}
	}
	return false
}

func TestBadInputIsInvalidArgumentAndChangesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		nan := &structpb.Struct{Fields: map[string]*structpb.Value{"amount": structpb.NewNumberValue(math.NaN())}}
		deep := map[string]any{}
		cur := deep
		for range 70 {
			next := map[string]any{}
			cur["x"] = next
			cur = next
		}
		cases := []struct {
			name  string
			req   *ledgerv1.ReserveRequest
			field string
		}{
			{"no id", &ledgerv1.ReserveRequest{Tool: "t"}, "operation_id"},
			{"newline", &ledgerv1.ReserveRequest{OperationId: "a\nb", Tool: "t"}, "operation_id"},
			{"NUL", &ledgerv1.ReserveRequest{OperationId: "a\x00b", Tool: "t"}, "operation_id"},
			{"10 KB", &ledgerv1.ReserveRequest{OperationId: strings.Repeat("k", 10<<10), Tool: "t"}, "operation_id"},
			{"no tool", &ledgerv1.ReserveRequest{OperationId: "x"}, "tool"},
			{"NaN", &ledgerv1.ReserveRequest{OperationId: "x", Tool: "t", Params: nan}, "params"},
			{"too deep", &ledgerv1.ReserveRequest{OperationId: "x", Tool: "t", Params: mustStruct(t, deep)}, "params"},
			{"short sha", &ledgerv1.ReserveRequest{OperationId: "x", Tool: "t", ParamsSha256: []byte{1}}, "params_sha256"},
			{"both", &ledgerv1.ReserveRequest{OperationId: "x", Tool: "t", ParamsSha256: make([]byte, 32), Params: mustStruct(t, map[string]any{})}, "params_sha256"},
			{"effect", &ledgerv1.ReserveRequest{OperationId: "x", Tool: "t", Effect: 259}, "effect"},
			{"timestamp", &ledgerv1.ReserveRequest{OperationId: "x", Tool: "t", RetainUntil: &timestamppb.Timestamp{Seconds: math.MaxInt64}}, "retain_until"},
		}
		for _, c := range cases {
			_, err := e.c.Reserve(e.ctx, c.req)
			if err == nil {
				t.Fatalf("%s: accepted", c.name)
			}
			_, ei, br := errorInfo(t, err)
			if status := codeOf(err); status != codes.InvalidArgument || ei.Reason != "INVALID_ARGUMENT" || br == nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if br.FieldViolations[0].Field != c.field {
				t.Errorf("%s: violation on %q, want %q", c.name, br.FieldViolations[0].Field, c.field)
			}
		}
		_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: "x", FencingToken: 1, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED,
			Result: &ledgerv1.Result{Data: nan}})
		wantReason(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		_, err = e.c.ListUnresolved(e.ctx, &ledgerv1.ListUnresolvedRequest{PageSize: 1 << 31})
		wantReason(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		if n, _ := e.rdb.DBSize(context.Background()).Result(); n != 0 && e.rdb != nil {
			// The shared server holds other tests' keys; the refused ids above
			// must not be among them.
			for _, id := range []string{"x", "a%0Ab"} {
				keys, _ := e.rdb.Keys(context.Background(), "*:op:default:"+id).Result()
				if len(keys) != 0 {
					t.Fatalf("a refused request wrote %v", keys)
				}
			}
		}
	})
}

func TestStoreUnreachableIsUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	e := startEnv(t, srv.Client(t))
	if _, err := e.c.Reserve(e.ctx, reserveReq(e.id("a"), "payments.refund", nil, newHolder())); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	_, err := e.c.Reserve(e.ctx, reserveReq(e.id("b"), "payments.refund", nil, newHolder()))
	wantReason(t, err, codes.Unavailable, "STORE_UNAVAILABLE")
	if !hasRetryInfo(err) {
		t.Fatal("STORE_UNAVAILABLE without RetryInfo")
	}
}

func TestHealthReflectionAndShutdown(t *testing.T) {
	e := startEnv(t, redistest.Shared(t).Client(t))
	hc := grpc_health_v1.NewHealthClient(e.conn)
	for _, svc := range []string{"", "ledger.v1.LedgerService"} {
		r, err := hc.Check(e.ctx, &grpc_health_v1.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != grpc_health_v1.HealthCheckResponse_SERVING {
			t.Fatalf("health %q = %v, %v", svc, r, err)
		}
	}
	stream, err := grpc_reflection_v1.NewServerReflectionClient(e.conn).ServerReflectionInfo(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&grpc_reflection_v1.ServerReflectionRequest{MessageRequest: &grpc_reflection_v1.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "ledger.v1.LedgerService") {
		t.Fatalf("reflection lists %v", names)
	}
	_ = stream.CloseSend()
}
