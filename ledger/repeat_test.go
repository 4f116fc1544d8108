package ledger

import (
	"math"
	"testing"
)

// A call repeated after the record moved on (a go-redis re-send, or a
// client's retry of a call whose answer was lost) is recognised from the
// history: it answers OK when it took effect and changes nothing. A
// reconciler's finding names its attempt, so a late repeat never resolves
// the next attempt: the duplicate below cannot happen.
func TestRepeatAfterTheRecordMovedOn(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		params := map[string]any{"amount": 10.0}

		t.Run("reconcile names its attempt", func(t *testing.T) {
			applied := 0 // the destination's count of refunds for this operation
			id := "fenced-reconcile"
			first := e.execute(t, id, "payments.refund") // attempt 1: the refund does not happen
			if _, err := e.markUnknown(t, id, first.FencingToken); err != nil {
				t.Fatal(err)
			}
			notApplied := ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: first.FencingToken}
			if o, err := e.l.Reconcile(e.ctx, e.who, notApplied); err != nil || o.State != StatePending {
				t.Fatalf("Reconcile(not applied, attempt 1) = %v, %v; want PENDING", o, err)
			}
			second := e.reserve(t, id, "payments.refund", params, "h2")
			if second.Decision != DecisionExecute || second.Operation.Attempt != 2 {
				t.Fatalf("Reserve = %v attempt %d, want EXECUTE attempt 2", second.Decision, second.Operation.Attempt)
			}
			applied++ // attempt 2 refunds, and its answer is lost
			if _, err := e.markUnknown(t, id, second.Operation.FencingToken); err != nil {
				t.Fatal(err)
			}
			before := e.lookup(t, id)

			// The reconciler's call about attempt 1 arrives again.
			o, err := e.l.Reconcile(e.ctx, e.who, notApplied)
			if err != nil {
				t.Fatalf("repeated Reconcile(not applied, attempt 1): %v, want OK (it took effect)", err)
			}
			if o.State != StateUnknown || o.Attempt != 2 {
				t.Fatalf("after the repeat: %v attempt %d, want UNKNOWN attempt 2", o.State, o.Attempt)
			}
			// A finding about attempt 1 that was never recorded is stale.
			_, err = e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingEscalate, FencingToken: first.FencingToken})
			if ke := wantKind(t, err, KindStaleToken); ke.State != StateUnknown {
				t.Fatalf("stale Reconcile: state %v, want UNKNOWN", ke.State)
			}
			after := e.lookup(t, id)
			if got, want := reasons(after), reasons(before); len(got) != len(want) {
				t.Fatalf("history %v, want it unchanged: %v", got, want)
			}
			// An agent retries: it must be told to reconcile, not to refund
			// a second time.
			e.retryMustReconcile(t, id, "payments.refund", params, "h3", &applied)
			if applied != 1 {
				t.Fatalf("the refund was applied %d times, want 1", applied)
			}
			// The finding about attempt 2 settles it.
			o, err = e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingApplied,
				Result: &Result{ResourceID: "re_2"}, FencingToken: second.Operation.FencingToken})
			if err != nil || o.State != StateSucceeded {
				t.Fatalf("Reconcile(applied, attempt 2) = %v, %v", o, err)
			}
		})

		t.Run("reconcile of a live claim's predecessor", func(t *testing.T) {
			id := "fenced-live"
			first := e.execute(t, id, "payments.refund")
			if _, err := e.complete(t, id, first.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
				t.Fatal(err)
			}
			if r := e.reserve(t, id, "payments.refund", params, "h2"); r.Decision != DecisionExecute {
				t.Fatalf("Reserve = %v, want EXECUTE", r.Decision)
			}
			_, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingAbandon, FencingToken: first.FencingToken})
			wantKind(t, err, KindStaleToken)
			if o := e.lookup(t, id); o.State != StateRunning || o.Attempt != 2 {
				t.Fatalf("after a stale Reconcile: %v attempt %d, want RUNNING attempt 2", o.State, o.Attempt)
			}
		})

		t.Run("complete retryable", func(t *testing.T) {
			id := "repeat-complete"
			first := e.execute(t, id, "payments.refund")
			if _, err := e.complete(t, id, first.FencingToken, OutcomeFailedRetryable, nil, &Failure{Code: "declined"}); err != nil {
				t.Fatal(err)
			}
			second := e.reserve(t, id, "payments.refund", params, "h2")
			if second.Decision != DecisionExecute {
				t.Fatalf("Reserve = %v, want EXECUTE", second.Decision)
			}
			before := e.lookup(t, id)
			o, err := e.complete(t, id, first.FencingToken, OutcomeFailedRetryable, nil, &Failure{Code: "declined"})
			if err != nil {
				t.Fatalf("repeated Complete(retryable, attempt 1): %v, want OK", err)
			}
			if o.State != StateRunning || o.FencingToken != second.Operation.FencingToken {
				t.Fatalf("after the repeat: %v token %d, want attempt 2's claim untouched", o.State, o.FencingToken)
			}
			// Another outcome under attempt 1's token is stale, not accepted.
			_, err = e.complete(t, id, first.FencingToken, OutcomeSucceeded, &Result{ResourceID: "re_1"}, nil)
			wantKind(t, err, KindStaleToken)
			if got, want := reasons(e.lookup(t, id)), reasons(before); len(got) != len(want) {
				t.Fatalf("history %v, want it unchanged: %v", got, want)
			}
			if o, err := e.complete(t, id, second.Operation.FencingToken, OutcomeSucceeded, &Result{ResourceID: "re_2"}, nil); err != nil || o.State != StateSucceeded {
				t.Fatalf("Complete(attempt 2) = %v, %v", o, err)
			}
		})

		t.Run("mark unknown", func(t *testing.T) {
			id := "repeat-unknown"
			first := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, first.FencingToken); err != nil {
				t.Fatal(err)
			}
			if _, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: first.FencingToken}); err != nil {
				t.Fatal(err)
			}
			second := e.reserve(t, id, "payments.refund", params, "h2")
			if second.Decision != DecisionExecute {
				t.Fatalf("Reserve = %v, want EXECUTE", second.Decision)
			}
			o, err := e.markUnknown(t, id, first.FencingToken)
			if err != nil {
				t.Fatalf("repeated MarkUnknown(attempt 1): %v, want OK", err)
			}
			if o.State != StateRunning || o.Attempt != 2 {
				t.Fatalf("after the repeat: %v attempt %d, want RUNNING attempt 2", o.State, o.Attempt)
			}
			// Tokens that never marked anything are stale, whatever their size.
			for _, tok := range []uint64{first.FencingToken - 1, 1, math.MaxUint64} {
				_, err = e.markUnknown(t, id, tok)
				wantKind(t, err, KindStaleToken)
				_, err = e.complete(t, id, tok, OutcomeFailedRetryable, nil, nil)
				wantKind(t, err, KindStaleToken)
				_, err = e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: tok})
				wantKind(t, err, KindStaleToken)
			}
		})
	})
}
