package server_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
)

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
	_, errs["Reserve"] = e.c.Reserve(e.ctx, reserveReq(id, "tiny.refund", mustStruct(t, map[string]any{"amount": 42}), newHolder()))
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
			op := e.claim(t, id, "tiny.refund", 0)
			e.complete(t, id, op.FencingToken, outSucceeded, "R-1")
			// tiny.* records live 1 s, then their tombstone 1 h.
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
			// Nothing brought the record back.
			_, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: id})
			wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_EXPIRED")
		})
	})

	t.Run("STORE_UNAVAILABLE", func(t *testing.T) {
		srv := redistest.Start(t)
		e := startEnv(t, srv.Client(t))
		id := e.id("op")
		op := e.claim(t, id, "tiny.refund", 0)
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
