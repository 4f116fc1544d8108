package server_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// TestS12ReconcileOfAPendingOperationRepeated: a reconciler finds nothing at
// the destination for an operation that is already PENDING (its attempt
// failed before the write), and the answer is lost. The next attempt applies
// the effect, its worker dies, and the lease expiry makes the operation
// UNKNOWN. Then the reconciler's call arrives again. It took effect once and
// must change nothing now: turning the UNKNOWN attempt back to PENDING would
// let a third attempt refund a second time. With its fencing token it is
// the repeat of a call about attempt 1 (OK); without one it cannot say it
// is not about attempt 2, and is refused (STALE_FENCING_TOKEN).
func TestS12ReconcileOfAPendingOperationRepeated(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		name := "without a fencing token"
		if fenced {
			name = "with the fencing token"
		}
		t.Run(name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, base *env) {
				dr := &dropper{armed: map[string]bool{}}
				e := startEnv(t, base.rdb, grpc.WithChainUnaryInterceptor(dr.intercept))
				d := newDestination(failBeforeWrite)
				id := e.id("refund")
				params := map[string]any{"amount": 42}

				// Attempt 1 is refused before the write: PENDING.
				first, err := e.c.Reserve(e.ctx, reserveReq(id, "short.refund", mustStruct(t, params), newHolder()))
				if err != nil || first.Decision != ledgerv1.Decision_DECISION_EXECUTE {
					t.Fatalf("Reserve = %v, %v", first, err)
				}
				if _, err := d.apply(id, "42"); err == nil {
					t.Fatal("the destination accepted the first request")
				}
				if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: first.Operation.FencingToken,
					Outcome: ledgerv1.Outcome_OUTCOME_FAILED_RETRYABLE, Failure: &ledgerv1.Failure{Code: "503"}}); err != nil {
					t.Fatal(err)
				}

				// The reconciler looks at the PENDING operation: nothing at
				// the destination. Its answer is lost.
				finding := &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_NOT_APPLIED, Note: "no refund at the bank"}
				if fenced {
					finding.FencingToken = first.Operation.FencingToken
				}
				dr.arm("Reconcile")
				if _, err := e.c.Reconcile(e.ctx, finding); status.Code(err) != codes.Unavailable {
					t.Fatalf("Reconcile = %v, want the lost response", err)
				}

				// Attempt 2 refunds; its worker dies before Complete.
				second, err := e.c.Reserve(e.ctx, reserveReq(id, "short.refund", mustStruct(t, params), newHolder()))
				if err != nil || second.Decision != ledgerv1.Decision_DECISION_EXECUTE || second.Operation.Attempt != 2 {
					t.Fatalf("Reserve = %v, %v; want EXECUTE attempt 2", second, err)
				}
				if _, err := d.apply(id, "42"); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(10 * time.Second)
				for e.lookup(t, id).State != ledgerv1.State_STATE_UNKNOWN {
					if time.Now().After(deadline) {
						t.Fatal("the expired claim never became UNKNOWN")
					}
					time.Sleep(50 * time.Millisecond)
				}
				before := e.lookup(t, id)

				// The reconciler's call arrives again: the same outcome as
				// the one call, and nothing changes.
				again, err := e.c.Reconcile(e.ctx, finding)
				switch {
				case !fenced:
					wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN")
				case err != nil:
					t.Fatalf("repeated Reconcile: %v, want OK (it took effect)", err)
				case again.Operation.State != ledgerv1.State_STATE_UNKNOWN || again.Operation.Attempt != 2:
					t.Fatalf("after the repeat: %v attempt %d, want UNKNOWN attempt 2", again.Operation.State, again.Operation.Attempt)
				}
				if got, want := reasonsOf(e.lookup(t, id)), reasonsOf(before); len(got) != len(want) {
					t.Fatalf("history %v, want it unchanged: %v", got, want)
				}

				// The agent retries the call: it reconciles, finds the
				// refund, and replays it.
				got, err := e.perform(t, d, id, "short.refund", params)
				if err != nil || got == "" {
					t.Fatalf("retry = %q, %v", got, err)
				}
				if n := d.count(id); n != 1 {
					t.Fatalf("the destination refunded %d times, want 1", n)
				}
			})
		})
	}
}
