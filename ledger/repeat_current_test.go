package ledger

import "testing"

// A call repeated while its token is still the current one, after other
// calls changed the record, is recognised from the history as well: it
// answers OK and changes nothing, so it cannot undo what came after it.
// Each case counts the effects at the destination where one could be
// applied twice.
func TestRepeatUndoesNothingThatCameAfter(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		params := map[string]any{"amount": 10.0}

		t.Run("reconcile after the worker reported unknown", func(t *testing.T) {
			applied := 0
			id := "reconcile-then-unknown"
			first := e.execute(t, id, "expiring.refund") // irreversible, 150 ms lease
			waitLeaseExpiry()
			e.sweep(t) // LEASE_EXPIRED: UNKNOWN
			notApplied := ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: first.FencingToken, Note: "no refund at the bank"}
			if o, err := e.l.Reconcile(e.ctx, e.who, notApplied); err != nil || o.State != StatePending {
				t.Fatalf("Reconcile(not applied) = %v, %v; want PENDING", o, err) // its answer is lost
			}
			applied++ // the slow worker's refund lands after the reconciler looked
			if o, err := e.markUnknown(t, id, first.FencingToken); err != nil || o.State != StateUnknown {
				t.Fatalf("MarkUnknown = %v, %v; want UNKNOWN", o, err)
			}
			before := reasons(e.lookup(t, id))

			// The reconciler's call arrives again.
			o, err := e.l.Reconcile(e.ctx, e.who, notApplied)
			if err != nil || o.State != StateUnknown {
				t.Fatalf("repeated Reconcile(not applied) = %v, %v; want OK, still UNKNOWN", o, err)
			}
			if got := reasons(e.lookup(t, id)); len(got) != len(before) {
				t.Fatalf("history %v, want it unchanged: %v", got, before)
			}
			e.retryMustReconcile(t, id, "expiring.refund", params, "h2", &applied)
			if applied != 1 {
				t.Fatalf("the refund was applied %d times, want 1", applied)
			}
			// A new look at the destination is a new call: it says so in
			// its note, and settles the operation.
			o, err = e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingApplied,
				FencingToken: first.FencingToken, Note: "refund found on second look", Result: &Result{ResourceID: "re_1"}})
			if err != nil || o.State != StateSucceeded {
				t.Fatalf("Reconcile(applied) = %v, %v; want SUCCEEDED", o, err)
			}
		})

		t.Run("a new finding about the same attempt", func(t *testing.T) {
			applied := 0
			id := "reconcile-again"
			first := e.execute(t, id, "expiring.refund")
			waitLeaseExpiry()
			e.sweep(t)
			look := func(note string, who Principal) *Operation {
				t.Helper()
				o, err := e.l.Reconcile(e.ctx, who, ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: first.FencingToken, Note: note})
				if err != nil {
					t.Fatalf("Reconcile(not applied, %q by %s): %v", note, who.ID, err)
				}
				return o
			}
			look("first look", e.who)
			// The worker, still out, cannot tell; the refund never happened.
			if _, err := e.markUnknown(t, id, first.FencingToken); err != nil {
				t.Fatal(err)
			}
			if o := look("first look", e.who); o.State != StateUnknown {
				t.Fatalf("the same call again: %v, want UNKNOWN (a repeat)", o.State)
			}
			// Another reconciler's look, or this one's with a new note, is a
			// new finding: the operation may run again, once.
			other := Principal{Tenant: e.who.Tenant, ID: "reconciler-2"}
			if o := look("first look", other); o.State != StatePending {
				t.Fatalf("another principal's finding: %v, want PENDING", o.State)
			}
			if r := e.reserve(t, id, "expiring.refund", params, "h2"); r.Decision == DecisionExecute {
				applied++
			}
			if applied != 1 {
				t.Fatalf("the refund was applied %d times, want 1", applied)
			}
		})

		// An unfenced finding the history holds about an earlier attempt
		// only is no repeat of a call about this one: answering OK would
		// say it took effect when it touched nothing, and applying it
		// would let a lost answer's retry return attempt 2, whose refund
		// may exist, to PENDING. It is refused and changes nothing; the
		// finding about attempt 2 names its token.
		for name, f := range map[string]Finding{"not applied": FindingNotApplied, "escalate": FindingEscalate} {
			t.Run("unfenced "+name+" after the next attempt", func(t *testing.T) {
				applied := 0
				id := "unfenced-reconcile-" + name
				first := e.execute(t, id, "payments.refund")
				if _, err := e.markUnknown(t, id, first.FencingToken); err != nil {
					t.Fatal(err)
				}
				unfenced := ReconcileRequest{OperationID: id, Finding: f} // no fencing_token
				if _, err := e.l.Reconcile(e.ctx, e.who, unfenced); err != nil {
					t.Fatal(err)
				}
				if f == FindingEscalate {
					// A human finds nothing at the destination.
					human := ReconcileRequest{OperationID: id, Finding: FindingNotApplied, Note: "checked by hand", FencingToken: first.FencingToken}
					if _, err := e.l.Reconcile(e.ctx, e.who, human); err != nil {
						t.Fatal(err)
					}
				}
				second := e.reserve(t, id, "payments.refund", params, "h2")
				if second.Decision != DecisionExecute {
					t.Fatalf("Reserve = %v, want EXECUTE", second.Decision)
				}
				applied++ // attempt 2 refunds, and cannot tell
				if _, err := e.markUnknown(t, id, second.Operation.FencingToken); err != nil {
					t.Fatal(err)
				}
				before := e.lookup(t, id)
				_, err := e.l.Reconcile(e.ctx, e.who, unfenced) // a lost answer's retry, or a new call with the old note
				wantKind(t, err, KindStaleToken)
				if o := e.lookup(t, id); o.State != StateUnknown || o.Attempt != 2 || o.NeedsReview || len(o.History) != len(before.History) {
					t.Fatalf("after the refused Reconcile: %v", o)
				}
				e.retryMustReconcile(t, id, "payments.refund", params, "h3", &applied)
				if applied != 1 {
					t.Fatalf("the refund was applied %d times, want 1", applied)
				}
				fenced := unfenced
				fenced.FencingToken = second.Operation.FencingToken
				o, err := e.l.Reconcile(e.ctx, e.who, fenced)
				if err != nil || o.Attempt != 2 || f == FindingNotApplied && o.State != StatePending || f == FindingEscalate && !o.NeedsReview {
					t.Fatalf("the finding about attempt 2 with its token = %v, %v", o, err)
				}
			})
		}

		t.Run("complete after the ledger concluded", func(t *testing.T) {
			id := "complete-after-abandon"
			first := e.execute(t, id, "expiring.refund")
			waitLeaseExpiry()
			if o, err := e.reconcile(t, id, FindingAbandon, nil); err != nil || o.State != StateFailedFinal {
				t.Fatalf("Reconcile(abandon) = %v, %v", o, err)
			}
			if _, err := e.complete(t, id, first.FencingToken, OutcomeFailedFinal, nil, &Failure{Code: "declined"}); err != nil {
				t.Fatalf("Complete(FAILED_FINAL) agreeing with the abandon: %v, want OK", err)
			}
			if _, err := e.complete(t, id, first.FencingToken, OutcomeFailedFinal, nil, &Failure{Code: "declined"}); err != nil {
				t.Fatalf("its repeat: %v, want OK", err)
			}
			_, err := e.complete(t, id, first.FencingToken, OutcomeSucceeded, &Result{ResourceID: "re_1"}, nil)
			wantKind(t, err, KindCompletionConflict)
			if o := e.lookup(t, id); o.State != StateFailedFinal {
				t.Fatalf("after a contradicting Complete: %v, history %v; want FAILED_FINAL", o.State, reasons(o))
			}
		})

		t.Run("mark unknown after a reconciler's finding", func(t *testing.T) {
			id := "unknown-then-reconciled"
			first := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, first.FencingToken); err != nil { // its answer is lost
				t.Fatal(err)
			}
			if o, err := e.reconcile(t, id, FindingNotApplied, nil); err != nil || o.State != StatePending {
				t.Fatalf("Reconcile(not applied) = %v, %v", o, err)
			}
			before := reasons(e.lookup(t, id))
			o, err := e.markUnknown(t, id, first.FencingToken) // the worker's retry
			if err != nil || o.State != StatePending {
				t.Fatalf("repeated MarkUnknown = %v, %v; want OK, still PENDING", o, err)
			}
			if got := reasons(e.lookup(t, id)); len(got) != len(before) {
				t.Fatalf("history %v, want it unchanged: %v", got, before)
			}
		})

		t.Run("mark unknown after the lease ran out, repeated after a finding", func(t *testing.T) {
			id := "expired-unknown-then-reconciled"
			first := e.execute(t, id, "expiring.refund")
			waitLeaseExpiry()
			e.sweep(t) // LEASE_EXPIRED: UNKNOWN before the worker says so

			// The worker's MarkUnknown; its answer is lost.
			if o, err := e.markUnknown(t, id, first.FencingToken); err != nil || o.State != StateUnknown {
				t.Fatalf("MarkUnknown on UNKNOWN = %v, %v", o, err)
			}
			if got := reasons(e.lookup(t, id)); got[len(got)-1] != "MARKED_UNKNOWN" {
				t.Fatalf("history %v, want the worker's report recorded", got)
			}
			finding := ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: first.FencingToken, Note: "no refund at the bank"}
			if o, err := e.l.Reconcile(e.ctx, e.who, finding); err != nil || o.State != StatePending {
				t.Fatalf("Reconcile(not applied) = %v, %v", o, err)
			}
			before := reasons(e.lookup(t, id))
			o, err := e.markUnknown(t, id, first.FencingToken) // the worker's retry
			if err != nil || o.State != StatePending {
				t.Fatalf("repeated MarkUnknown = %v, %v; want OK, still PENDING", o, err)
			}
			if got := reasons(e.lookup(t, id)); len(got) != len(before) {
				t.Fatalf("history %v, want it unchanged: %v", got, before)
			}
			// The finding stands: the next call runs the refund (no attempt
			// ever applied it).
			if r := e.reserve(t, id, "expiring.refund", params, "h2"); r.Decision != DecisionExecute {
				t.Fatalf("Reserve after the finding = %v, want EXECUTE", r.Decision)
			}
		})

		t.Run("retryable failure reported while pending", func(t *testing.T) {
			id := "retryable-from-pending"
			first := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, first.FencingToken); err != nil {
				t.Fatal(err)
			}
			if _, err := e.reconcile(t, id, FindingNotApplied, nil); err != nil {
				t.Fatal(err)
			}
			fail := &Failure{Code: "503"}
			if o, err := e.complete(t, id, first.FencingToken, OutcomeFailedRetryable, nil, fail); err != nil || o.State != StatePending {
				t.Fatalf("Complete(retryable) from PENDING = %v, %v", o, err) // its answer is lost
			}
			if got := reasons(e.lookup(t, id)); got[len(got)-1] != "FAILED_RETRYABLE" {
				t.Fatalf("history %v, want the report recorded", got)
			}
			second := e.reserve(t, id, "payments.refund", params, "h2")
			if second.Decision != DecisionExecute {
				t.Fatalf("Reserve = %v, want EXECUTE", second.Decision)
			}
			o, err := e.complete(t, id, first.FencingToken, OutcomeFailedRetryable, nil, fail)
			if err != nil || o.State != StateRunning || o.FencingToken != second.Operation.FencingToken {
				t.Fatalf("repeated Complete(retryable) = %v, %v; want OK, attempt 2's claim untouched", o, err)
			}
		})
	})
}
