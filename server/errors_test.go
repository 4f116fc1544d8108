package server_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/server"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
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
		comp := reserveReq(e.id("comp"), "payments.refund", params, newHolder())
		comp.Compensates = e.id("live")
		_, err = e.c.Reserve(e.ctx, comp)
		if ei := wantState(t, err, "NOT_COMPENSABLE", "STATE_RUNNING"); ei.Metadata["cause"] != "not_succeeded" {
			t.Fatalf("NOT_COMPENSABLE metadata %v", ei.Metadata)
		}
		comp.Compensates = e.id("never")
		_, err = e.c.Reserve(e.ctx, comp)
		if ei := wantReason(t, err, codes.FailedPrecondition, "NOT_COMPENSABLE"); ei.Metadata["cause"] != "not_found" {
			t.Fatalf("NOT_COMPENSABLE metadata %v", ei.Metadata)
		}
		_, err = e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: e.id("live"), Finding: ledgerv1.Finding_FINDING_APPLIED})
		wantReason(t, err, codes.FailedPrecondition, "OPERATION_IN_PROGRESS")
		if !hasRetryInfo(err) {
			t.Fatal("OPERATION_IN_PROGRESS without RetryInfo")
		}
		_, err = e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: e.id("live"), FencingToken: live.Operation.FencingToken - 1, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED})
		wantState(t, err, "STALE_FENCING_TOKEN", "STATE_RUNNING")
		if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: e.id("live"), FencingToken: live.Operation.FencingToken, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED}); err != nil {
			t.Fatal(err)
		}
		_, err = e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: e.id("live"), FencingToken: live.Operation.FencingToken, Outcome: ledgerv1.Outcome_OUTCOME_FAILED_FINAL})
		wantState(t, err, "COMPLETION_CONFLICT", "STATE_SUCCEEDED")
		_, err = e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: e.id("live"), Finding: ledgerv1.Finding_FINDING_ABANDON})
		wantState(t, err, "ALREADY_RESOLVED", "STATE_SUCCEEDED")
		if msg := status.Convert(err).Message(); !strings.Contains(msg, "another finding or outcome") {
			t.Fatalf("ALREADY_RESOLVED message %q", msg)
		}

		tiny, err := e.c.Reserve(e.ctx, reserveReq(e.id("tiny"), "compact.refund", params, newHolder()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: e.id("tiny"), FencingToken: tiny.Operation.FencingToken, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err = e.c.Reserve(e.ctx, reserveReq(e.id("tiny"), "compact.refund", params, newHolder()))
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

// wantState fails unless err is FAILED_PRECONDITION with reason and the
// record's state in the ErrorInfo's metadata.
func wantState(t *testing.T, err error, reason, state string) *errdetails.ErrorInfo {
	t.Helper()
	ei := wantReason(t, err, codes.FailedPrecondition, reason)
	if ei.Metadata["state"] != state {
		t.Fatalf("%s: metadata %v, want state %s", reason, ei.Metadata, state)
	}
	return ei
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

// everyRPC calls each RPC of the service about id, with token where one is
// needed, Reserve last, and returns the errors by method.
func (e *env) everyRPC(t *testing.T, id string, token uint64) map[string]error {
	t.Helper()
	errs := map[string]error{}
	_, errs["Complete"] = e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: token, Outcome: outSucceeded})
	_, errs["MarkUnknown"] = e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: token})
	_, errs["Renew"] = e.c.Renew(e.ctx, &ledgerv1.RenewRequest{OperationId: id, FencingToken: token})
	_, errs["Reconcile"] = e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: notApplied})
	_, errs["Lookup"] = e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: id})
	// Last: on an id that does not exist, Reserve creates it.
	_, errs["Reserve"] = e.c.Reserve(e.ctx, reserveReq(id, "compact.refund", mustStruct(t, map[string]any{"amount": 42}), newHolder()))
	return errs
}

// TestEveryRPCErrors: NOT_FOUND, IDEMPOTENCY_KEY_EXPIRED and
// STORE_UNAVAILABLE are answered by every RPC about an operation with the
// code, ErrorInfo and details of contract.md §5, not only by Reserve and Lookup.
func TestEveryRPCErrors(t *testing.T) {
	t.Run("NOT_FOUND", func(t *testing.T) {
		eachBackend(t, func(t *testing.T, e *env) {
			id := e.id("never")
			for method, err := range e.everyRPC(t, id, 1) {
				if method == "Reserve" {
					continue
				}
				if c, ei, _ := errorInfo(t, err); c != codes.NotFound || ei.Reason != "NOT_FOUND" {
					t.Errorf("%s of an unknown id = %v", method, err)
				}
			}
			// The refused calls left nothing: Reserve (called last) made
			// the record, as the first call about the id.
			if op := e.lookup(t, id); op.State != running || op.Attempt != 1 || len(op.History) != 1 || op.History[0].Reason != "RESERVED" {
				t.Errorf("the record after the refused calls and a Reserve = %v", op)
			}
		})
	})

	t.Run("IDEMPOTENCY_KEY_EXPIRED", func(t *testing.T) {
		eachBackend(t, func(t *testing.T, e *env) {
			id := e.id("tiny")
			op := e.claim(t, id, "compact.refund", 0)
			e.complete(t, id, op.FencingToken, outSucceeded, "R-1")
			live, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: id})
			if err != nil {
				t.Fatal(err)
			}
			// compact.* records live 1 s, then their tombstone 1 h.
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: id})
				if err != nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			for method, err := range e.everyRPC(t, id, op.FencingToken) {
				c, ei, _ := errorInfo(t, err)
				if c != codes.FailedPrecondition || ei.Reason != "IDEMPOTENCY_KEY_EXPIRED" || ei.Metadata["final_state"] != "STATE_SUCCEEDED" {
					t.Errorf("%s of an expired operation = %v, %v", method, err, ei.Metadata)
				}
			}
			// Nothing brought the record back, and Lookup answers the head
			// of its history chain.
			_, err = e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: id})
			if ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_EXPIRED"); ei.Metadata["history_head"] != live.Operation.HistoryHead {
				t.Errorf("expired Lookup's history_head %q, want %q", ei.Metadata["history_head"], live.Operation.HistoryHead)
			}
		})
	})

	t.Run("STORE_UNAVAILABLE", func(t *testing.T) {
		srv := redistest.Start(t)
		e := startEnv(t, srv.Client(t))
		id := e.id("op")
		op := e.claim(t, id, "compact.refund", 0)
		srv.Stop()
		errs := e.everyRPC(t, id, op.FencingToken)
		_, errs["ListUnresolved"] = e.c.ListUnresolved(e.ctx, &ledgerv1.ListUnresolvedRequest{})
		for method, err := range errs {
			if c, ei, _ := errorInfo(t, err); c != codes.Unavailable || ei.Reason != "STORE_UNAVAILABLE" || !hasRetryInfo(err) {
				t.Errorf("%s with the store down = %v", method, err)
			}
		}
	})
}

// TestFieldViolationsNameTheWireField: a bad field of any RPC is refused
// with INVALID_ARGUMENT and a BadRequest whose field violation names the
// request field as the proto spells it (a path into nested messages), so a
// client in any language can point at it. The record is left as it was.
func TestFieldViolationsNameTheWireField(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		id := e.id("op")
		res, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 1}), newHolder()))
		if err != nil {
			t.Fatal(err)
		}
		tok := res.Operation.FencingToken
		before := e.lookup(t, id)
		long := strings.Repeat("n", 300)
		succeeded := ledgerv1.Outcome_OUTCOME_SUCCEEDED

		cases := []struct {
			name  string
			call  func() error
			field string
		}{
			{"Reserve permit_id", func() error {
				r := reserveReq(id, "payments.refund", nil, newHolder())
				r.PermitId = strings.Repeat("p", 300)
				_, err := e.c.Reserve(e.ctx, r)
				return err
			}, "permit_id"},
			{"Reserve holder", func() error {
				_, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", nil, "a\nb"))
				return err
			}, "holder"},
			{"Reserve run_id", func() error {
				r := reserveReq(id, "payments.refund", nil, newHolder())
				r.RunId = strings.Repeat("r", 300)
				_, err := e.c.Reserve(e.ctx, r)
				return err
			}, "run_id"},
			{"Complete fencing_token", func() error {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, Outcome: succeeded})
				return err
			}, "fencing_token"},
			{"Complete outcome", func() error {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok})
				return err
			}, "outcome"},
			{"Complete result.resource_id", func() error {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok, Outcome: succeeded,
					Result: &ledgerv1.Result{ResourceId: strings.Repeat("x", 300)}})
				return err
			}, "result.resource_id"},
			{"Complete result.data", func() error {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok, Outcome: succeeded,
					Result: &ledgerv1.Result{Data: mustStruct(t, map[string]any{"blob": strings.Repeat("x", 70<<10)})}})
				return err
			}, "result.data"},
			{"Complete failure.message", func() error {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok, Outcome: ledgerv1.Outcome_OUTCOME_FAILED_FINAL,
					Failure: &ledgerv1.Failure{Message: strings.Repeat("m", 2000)}})
				return err
			}, "failure.message"},
			{"MarkUnknown reason", func() error {
				_, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: tok, Reason: long})
				return err
			}, "reason"},
			{"Renew operation_id", func() error {
				_, err := e.c.Renew(e.ctx, &ledgerv1.RenewRequest{FencingToken: tok})
				return err
			}, "operation_id"},
			{"Lookup operation_id", func() error {
				_, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: "a\x00b"})
				return err
			}, "operation_id"},
			{"Reconcile finding", func() error {
				_, err := e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id})
				return err
			}, "finding"},
			{"Reconcile note", func() error {
				_, err := e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_ESCALATE, Note: long})
				return err
			}, "note"},
			{"Reconcile failure.code", func() error {
				_, err := e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_ABANDON,
					Failure: &ledgerv1.Failure{Code: strings.Repeat("c", 200)}})
				return err
			}, "failure.code"},
			{"ListUnresolved states", func() error {
				_, err := e.c.ListUnresolved(e.ctx, &ledgerv1.ListUnresolvedRequest{States: []ledgerv1.State{ledgerv1.State_STATE_SUCCEEDED}})
				return err
			}, "states"},
			{"ListUnresolved page_token", func() error {
				_, err := e.c.ListUnresolved(e.ctx, &ledgerv1.ListUnresolvedRequest{PageToken: "not a token"})
				return err
			}, "page_token"},
			{"ListUnresolved tool", func() error {
				_, err := e.c.ListUnresolved(e.ctx, &ledgerv1.ListUnresolvedRequest{Tool: "no spaces"})
				return err
			}, "tool"},
		}
		for _, c := range cases {
			err := c.call()
			if err == nil {
				t.Fatalf("%s: accepted", c.name)
			}
			code, ei, br := errorInfo(t, err)
			if code != codes.InvalidArgument || ei.Reason != "INVALID_ARGUMENT" || br == nil || len(br.FieldViolations) == 0 {
				t.Fatalf("%s: %v, want INVALID_ARGUMENT with a BadRequest", c.name, err)
			}
			var fields []string
			for _, v := range br.FieldViolations {
				fields = append(fields, v.Field)
			}
			if len(fields) != 1 || fields[0] != c.field {
				t.Errorf("%s: violations on %q, want only %q", c.name, fields, c.field)
			}
		}
		if after := e.lookup(t, id); !proto.Equal(before, after) {
			t.Fatalf("a refused request changed the record:\n%v\n%v", before, after)
		}
	})
}
