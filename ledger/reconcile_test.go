package ledger

import (
	"bytes"
	"reflect"
	"slices"
	"testing"
)

// TestReconcileHistory: Reconcile answers with the record's history, as
// Lookup reads it right after, for every finding and for a repeat.
func TestReconcileHistory(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		for _, c := range []struct {
			finding Finding
			want    []string
		}{
			{FindingApplied, []string{"RESERVED", "MARKED_UNKNOWN", "RECONCILED_APPLIED"}},
			{FindingNotApplied, []string{"RESERVED", "MARKED_UNKNOWN", "RECONCILED_NOT_APPLIED"}},
			{FindingAbandon, []string{"RESERVED", "MARKED_UNKNOWN", "ABANDONED"}},
			{FindingEscalate, []string{"RESERVED", "MARKED_UNKNOWN", "ESCALATED"}},
		} {
			id := "op-" + itoa(int64(c.finding))
			o := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, o.FencingToken); err != nil {
				t.Fatal(err)
			}
			got, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: c.finding, Note: "looked"})
			if err != nil {
				t.Fatalf("Reconcile(%v): %v", c.finding, err)
			}
			if r := reasons(got); !slices.Equal(r, c.want) {
				t.Fatalf("Reconcile(%v) history = %v, want %v", c.finding, r, c.want)
			}
			if last := got.History[len(got.History)-1]; last.Detail != "looked" || last.Principal != e.who.ID || last.FencingToken != o.FencingToken {
				t.Errorf("Reconcile(%v) latest entry = %+v", c.finding, last)
			}
			if look := e.lookup(t, id); !reflect.DeepEqual(got.History, look.History) {
				t.Errorf("Reconcile(%v) history = %+v, Lookup's = %+v", c.finding, got.History, look.History)
			}
			// A repeat changes nothing and answers with the same history.
			again, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: c.finding, Note: "looked"})
			if err != nil {
				t.Fatalf("repeat Reconcile(%v): %v", c.finding, err)
			}
			if !reflect.DeepEqual(again.History, got.History) {
				t.Errorf("repeat Reconcile(%v) history = %+v, want %+v", c.finding, again.History, got.History)
			}
		}
	})
}

// TestReconcileRepeatAfterTheRecordWentTerminal: a NOT_APPLIED or ESCALATE
// finding that took effect, repeated (same principal, note and attempt)
// after the operation went on to a terminal state, answers OK with the
// record as it is and changes nothing, as its repeat does while the
// operation is not terminal: every ledger RPC is safe to retry, and the
// reconciler whose answer was lost must not be told its finding was
// refused. A new finding (another note, another principal, another
// attempt's token) is still ALREADY_RESOLVED, and so is the repeat without
// a token once another attempt resolved the operation: it cannot say it
// was about the earlier one.
func TestReconcileRepeatAfterTheRecordWentTerminal(t *testing.T) {
	cases := []struct {
		name    string
		finding Finding
		// settle takes the operation, after the finding, to a terminal state.
		settle func(t *testing.T, e *env, id string)
		// nextAttempt: settle runs another attempt.
		nextAttempt bool
	}{
		{"NOT_APPLIED, then the next attempt succeeded", FindingNotApplied, func(t *testing.T, e *env, id string) {
			o := e.execute(t, id, "payments.refund")
			if _, err := e.complete(t, id, o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r-2"}, nil); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"NOT_APPLIED, then abandoned", FindingNotApplied, func(t *testing.T, e *env, id string) {
			if _, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingAbandon, Note: "gave up"}); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"ESCALATE, then applied by a human", FindingEscalate, func(t *testing.T, e *env, id string) {
			if _, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingApplied, Result: &Result{ResourceID: "r-1"}, Note: "checked by hand"}); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	eachBackend(t, func(t *testing.T, e *env) {
		other := Principal{Tenant: e.who.Tenant, ID: "reconciler-2"}
		for _, c := range cases {
			for _, fenced := range []bool{false, true} {
				name := c.name
				if fenced {
					name += ", with the attempt's token"
				}
				t.Run(name, func(t *testing.T) {
					id := "op-" + randomHex(4)
					o := e.execute(t, id, "payments.refund")
					if _, err := e.markUnknown(t, id, o.FencingToken); err != nil {
						t.Fatal(err)
					}
					first := ReconcileRequest{OperationID: id, Finding: c.finding, Note: "looked at the bank"}
					if fenced {
						first.FencingToken = o.FencingToken
					}
					if _, err := e.l.Reconcile(e.ctx, e.who, first); err != nil {
						t.Fatalf("the finding: %v", err)
					}
					c.settle(t, e, id)
					want := e.lookup(t, id)
					if want.State != StateSucceeded && want.State != StateFailedFinal {
						t.Fatalf("state %v after settling, want a terminal one", want.State)
					}
					key := e.opKeys(id).all[0]
					before, err := e.rdb.Get(e.ctx, key).Result()
					if err != nil {
						t.Fatal(err)
					}

					got, err := e.l.Reconcile(e.ctx, e.who, first)
					switch {
					case c.nextAttempt && !fenced:
						if le := wantKind(t, err, KindAlreadyResolved); le.State != want.State {
							t.Fatalf("the unfenced repeat: state %v, want %v", le.State, want.State)
						}
					case err != nil:
						t.Fatalf("the finding repeated after the operation went %v: %v", want.State, err)
					case got.State != want.State || len(got.History) != len(want.History):
						t.Fatalf("the repeat answered %v with %d history entries, the record is %v with %d", got.State, len(got.History), want.State, len(want.History))
					}

					renoted := first
					renoted.Note = "looked again"
					byOther := first
					wrongAttempt := first
					wrongAttempt.FencingToken = o.FencingToken + 1
					for _, r := range []struct {
						what string
						who  Principal
						req  ReconcileRequest
					}{{"another note", e.who, renoted}, {"another principal", other, byOther}, {"another attempt", e.who, wrongAttempt}} {
						_, err := e.l.Reconcile(e.ctx, r.who, r.req)
						if le := wantKind(t, err, KindAlreadyResolved); le.State != want.State {
							t.Fatalf("%s: state %v, want %v", r.what, le.State, want.State)
						}
					}
					if after, err := e.rdb.Get(e.ctx, key).Result(); err != nil || after != before {
						t.Fatalf("the stored record changed (%v):\nbefore %q\nafter  %q", err, before, after)
					}
				})
			}
		}
	})
}

// TestReconcileTerminalSameFinding: on a terminal record "the same finding"
// (contract.md §4) is the same kind with the same outcome: for APPLIED the result
// data and resource id that stand, for ABANDON the failure code and message
// that stand (the code ABANDONED when none is given), however the record
// got there. It answers OK with the record; any other finding, a different
// result or failure included, is KindAlreadyResolved with the record's state
// and changes nothing, so a reconciler never hears OK for an outcome the
// ledger does not hold.
func TestReconcileTerminalSameFinding(t *testing.T) {
	resA := &Result{Data: []byte(`{"receipt":"A"}`), ResourceID: "r-A"}
	resB := &Result{Data: []byte(`{"receipt":"B"}`), ResourceID: "r-A"}
	resOtherID := &Result{Data: []byte(`{"receipt":"A"}`), ResourceID: "r-B"}
	resNoID := &Result{Data: []byte(`{"receipt":"A"}`)}
	emptyData := &Result{Data: []byte(`{}`)}
	failX := &Failure{Code: "GONE", Message: "no such order"}
	failY := &Failure{Code: "OTHER", Message: "no such order"}
	failXOtherMsg := &Failure{Code: "GONE", Message: "order cancelled"}
	failXNoMsg := &Failure{Code: "GONE"}
	abandoned := &Failure{Code: "ABANDONED"}
	declined := &Failure{Code: "DECLINED", Message: "card declined"}
	exhausted := &Failure{Code: "RETRIES_EXHAUSTED", Message: "the policy allows 3 attempts"}

	type finding struct {
		f Finding
		r *Result
		x *Failure
	}
	cases := []struct {
		name  string
		state State
		setup func(t *testing.T, e *env, id string)
		same  []finding // answered OK
		other []finding // answered KindAlreadyResolved
	}{
		{"SUCCEEDED by Complete", StateSucceeded, func(t *testing.T, e *env, id string) {
			o := e.execute(t, id, "payments.refund")
			if _, err := e.complete(t, id, o.FencingToken, OutcomeSucceeded, resA, nil); err != nil {
				t.Fatal(err)
			}
		}, []finding{{FindingApplied, resA, nil}},
			[]finding{{FindingApplied, resB, nil}, {FindingApplied, resOtherID, nil}, {FindingApplied, resNoID, nil},
				{FindingApplied, nil, nil}, {FindingAbandon, nil, nil}, {FindingNotApplied, nil, nil}, {FindingEscalate, nil, nil}}},
		{"SUCCEEDED by APPLIED", StateSucceeded, func(t *testing.T, e *env, id string) {
			o := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, o.FencingToken); err != nil {
				t.Fatal(err)
			}
			if _, err := e.reconcile(t, id, FindingApplied, resA); err != nil {
				t.Fatal(err)
			}
		}, []finding{{FindingApplied, resA, nil}},
			[]finding{{FindingApplied, resB, nil}, {FindingApplied, resOtherID, nil}, {FindingApplied, nil, nil},
				{FindingAbandon, nil, failX}, {FindingNotApplied, nil, nil}}},
		{"SUCCEEDED by APPLIED without a result", StateSucceeded, func(t *testing.T, e *env, id string) {
			o := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, o.FencingToken); err != nil {
				t.Fatal(err)
			}
			if _, err := e.reconcile(t, id, FindingApplied, nil); err != nil {
				t.Fatal(err)
			}
		}, []finding{{FindingApplied, nil, nil}, {FindingApplied, &Result{}, nil}, {FindingApplied, emptyData, nil}},
			[]finding{{FindingApplied, resA, nil}, {FindingApplied, &Result{ResourceID: "r-A"}, nil}}},
		// An empty object and no data are the same result: SDKs differ in
		// which they send for "nothing" (Go none, Python and Node {}).
		{"SUCCEEDED by Complete with an empty object", StateSucceeded, func(t *testing.T, e *env, id string) {
			o := e.execute(t, id, "payments.refund")
			if _, err := e.complete(t, id, o.FencingToken, OutcomeSucceeded, emptyData, nil); err != nil {
				t.Fatal(err)
			}
		}, []finding{{FindingApplied, emptyData, nil}, {FindingApplied, nil, nil}, {FindingApplied, &Result{}, nil}},
			[]finding{{FindingApplied, resA, nil}, {FindingApplied, &Result{Data: []byte(`{}`), ResourceID: "r-A"}, nil}}},
		{"FAILED_FINAL by ABANDON", StateFailedFinal, func(t *testing.T, e *env, id string) {
			o := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, o.FencingToken); err != nil {
				t.Fatal(err)
			}
			if _, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingAbandon, Failure: failX}); err != nil {
				t.Fatal(err)
			}
		}, []finding{{FindingAbandon, nil, failX}},
			[]finding{{FindingAbandon, nil, failY}, {FindingAbandon, nil, failXOtherMsg}, {FindingAbandon, nil, failXNoMsg},
				{FindingAbandon, nil, nil}, {FindingApplied, resA, nil}, {FindingNotApplied, nil, nil}}},
		{"FAILED_FINAL by ABANDON without a failure", StateFailedFinal, func(t *testing.T, e *env, id string) {
			o := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, o.FencingToken); err != nil {
				t.Fatal(err)
			}
			if _, err := e.reconcile(t, id, FindingAbandon, nil); err != nil {
				t.Fatal(err)
			}
		}, []finding{{FindingAbandon, nil, nil}, {FindingAbandon, nil, abandoned}, {FindingAbandon, nil, &Failure{}}},
			[]finding{{FindingAbandon, nil, failX}, {FindingAbandon, nil, &Failure{Message: "gave up"}}}},
		// The worker's own final failure stands: an ABANDON agrees with it
		// only when it reports that very failure.
		{"FAILED_FINAL by Complete", StateFailedFinal, func(t *testing.T, e *env, id string) {
			o := e.execute(t, id, "payments.refund")
			if _, err := e.complete(t, id, o.FencingToken, OutcomeFailedFinal, nil, declined); err != nil {
				t.Fatal(err)
			}
		}, []finding{{FindingAbandon, nil, declined}},
			[]finding{{FindingAbandon, nil, nil}, {FindingAbandon, nil, failX}, {FindingAbandon, nil, &Failure{Code: "DECLINED"}},
				{FindingApplied, resA, nil}}},
		// So does the ledger's own conclusion.
		{"FAILED_FINAL by RETRIES_EXHAUSTED", StateFailedFinal, func(t *testing.T, e *env, id string) {
			for range 3 {
				o := e.execute(t, id, "payments.refund")
				if _, err := e.complete(t, id, o.FencingToken, OutcomeFailedRetryable, nil, &Failure{Code: "503"}); err != nil {
					t.Fatal(err)
				}
			}
			if r := e.reserve(t, id, "payments.refund", map[string]any{"amount": 10.0}, "h-last"); r.Operation.Reason != "RETRIES_EXHAUSTED" {
				t.Fatalf("Reserve with no attempts left = %v %+v", r.Decision, r.Operation)
			}
		}, []finding{{FindingAbandon, nil, exhausted}},
			[]finding{{FindingAbandon, nil, nil}, {FindingAbandon, nil, failX}, {FindingApplied, resA, nil}}},
	}
	eachBackend(t, func(t *testing.T, e *env) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				id := "op-" + randomHex(4)
				c.setup(t, e, id)
				key := e.opKeys(id).all[0]
				stored := func() string {
					t.Helper()
					s, err := e.rdb.Get(e.ctx, key).Result()
					if err != nil {
						t.Fatal(err)
					}
					return s
				}
				before := stored()
				want := e.lookup(t, id)
				if want.State != c.state {
					t.Fatalf("state %v after the setup, want %v", want.State, c.state)
				}
				for i, f := range c.same {
					got, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: f.f, Result: f.r, Failure: f.x, Note: "again"})
					if err != nil {
						t.Fatalf("same finding %d (%v %+v %+v): %v", i, f.f, f.r, f.x, err)
					}
					if got.State != c.state || !sameResult(got.Result, want.Result) || !sameFailure(got.Failure, want.Failure) {
						t.Fatalf("same finding %d answered %+v, the record holds %+v", i, got, want)
					}
				}
				for i, f := range c.other {
					_, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: f.f, Result: f.r, Failure: f.x})
					if le := wantKind(t, err, KindAlreadyResolved); le.State != c.state {
						t.Fatalf("other finding %d (%v %+v %+v): state %v, want %v", i, f.f, f.r, f.x, le.State, c.state)
					}
				}
				if after := stored(); after != before {
					t.Fatalf("the stored record changed:\nbefore %q\nafter  %q", before, after)
				}
				// The business outcome: the next Reserve replays what stands.
				r := e.reserve(t, id, "payments.refund", map[string]any{"amount": 10.0}, "h-next")
				if r.Decision != DecisionReplay || !sameResult(r.Operation.Result, want.Result) || !sameFailure(r.Operation.Failure, want.Failure) {
					t.Fatalf("Reserve after = %v %+v, want REPLAY of %+v", r.Decision, r.Operation, want)
				}
			})
		}
	})
}

func sameResult(a, b *Result) bool {
	if a == nil || b == nil {
		return a == b
	}
	return bytes.Equal(a.Data, b.Data) && a.ResourceID == b.ResourceID
}

func sameFailure(a, b *Failure) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// TestReconcileRules: contract.md §4's rules for Reconcile: accepted from
// UNKNOWN and from RUNNING past its lease, refused while a lease is live;
// APPLIED → SUCCEEDED with the result, NOT_APPLIED → PENDING, ABANDON →
// FAILED_FINAL, ESCALATE → UNKNOWN for review. Terminal records:
// TestReconcileTerminalSameFinding.
func TestReconcileRules(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		froms := []struct {
			name  string
			tool  string
			from  State
			setup func(id, tool string)
		}{
			{"UNKNOWN by MarkUnknown", "payments.refund", StateUnknown, func(id, tool string) {
				e.unknown(t, id, e.claim(t, id, tool, 0).FencingToken)
			}},
			{"UNKNOWN by lease expiry", "expiring.refund", StateUnknown, func(id, tool string) {
				e.expire(t, e.claim(t, id, tool, 0))
			}},
			{"RUNNING past lease, idempotent", "expiring.idempotent", StateRunning, func(id, tool string) {
				e.waitLeaseEnd(t, e.claim(t, id, tool, 0))
			}},
		}
		want := map[Finding]struct {
			state  State
			reason string
		}{
			FindingApplied:    {StateSucceeded, "RECONCILED_APPLIED"},
			FindingNotApplied: {StatePending, "RECONCILED_NOT_APPLIED"},
			FindingAbandon:    {StateFailedFinal, "ABANDONED"},
			FindingEscalate:   {StateUnknown, "ESCALATED"},
		}
		for _, from := range froms {
			for _, f := range []Finding{FindingApplied, FindingNotApplied, FindingAbandon, FindingEscalate} {
				id := from.name + " " + want[f].reason
				t.Run(id, func(t *testing.T) {
					from.setup(id, from.tool)
					if st := e.lookup(t, id).State; st != from.from {
						t.Fatalf("state %v before the finding, want %v", st, from.from)
					}
					o, err := e.reconcileAs(t, id, f)
					if err != nil {
						t.Fatalf("Reconcile(%v) from %s: %v", f, from.name, err)
					}
					h := o.History[len(o.History)-1]
					if o.State != want[f].state || o.Reason != want[f].reason || h.Reason != want[f].reason || h.From != from.from ||
						h.To != want[f].state || h.Detail != "checked the destination" || h.Principal != "agent-1" || !o.LeaseExpiresAt.IsZero() {
						t.Fatalf("Reconcile(%v) = %+v", f, o)
					}
					// What the next Reserve decides is the business outcome.
					res := e.reserveAs(t, id, from.tool, 0, "h-next")
					switch f {
					case FindingApplied:
						if o.Result.ResourceID != "R-found" || string(o.Result.Data) != `{"receipt":"R-found"}` ||
							res.Decision != DecisionReplay || res.Operation.Result.ResourceID != "R-found" {
							t.Fatalf("APPLIED: %+v, then Reserve = %+v", o, res)
						}
					case FindingNotApplied:
						if res.Decision != DecisionExecute || res.Operation.Attempt != 2 {
							t.Fatalf("NOT_APPLIED, then Reserve = %+v, want EXECUTE attempt 2", res)
						}
					case FindingAbandon:
						if o.Failure.Code != "gave_up" || res.Decision != DecisionReplay || res.Operation.Failure.Code != "gave_up" {
							t.Fatalf("ABANDON: %+v, then Reserve = %+v", o, res)
						}
					case FindingEscalate:
						if !o.NeedsReview || o.UnknownSince.IsZero() {
							t.Fatalf("ESCALATE: %+v", o)
						}
						// Flagged for a human: whatever its effect, the
						// operation waits for a finding (design.md, 3.3).
						if res.Decision != DecisionReconcile || !e.lookup(t, id).NeedsReview {
							t.Fatalf("ESCALATE, then Reserve = %+v, want RECONCILE, still flagged", res)
						}
						if o, err := e.reconcileAs(t, id, FindingNotApplied); err != nil || o.State != StatePending || o.NeedsReview {
							t.Fatalf("NOT_APPLIED after ESCALATE = %+v, %v", o, err)
						}
						if res := e.reserveAs(t, id, from.tool, 0, "h-last"); res.Decision != DecisionExecute {
							t.Fatalf("ESCALATE, NOT_APPLIED, then Reserve = %+v, want EXECUTE", res)
						}
					}
				})
			}
		}

		t.Run("ESCALATE, then a finding clears the review flag", func(t *testing.T) {
			e.unknown(t, "escalated", e.claim(t, "escalated", "payments.refund", 0).FencingToken)
			if _, err := e.reconcileAs(t, "escalated", FindingEscalate); err != nil {
				t.Fatal(err)
			}
			o, err := e.reconcileAs(t, "escalated", FindingApplied)
			if err != nil || o.State != StateSucceeded || o.NeedsReview {
				t.Fatalf("APPLIED after ESCALATE = %+v, %v", o, err)
			}
		})

		t.Run("live lease", func(t *testing.T) {
			live := e.claim(t, "live", "payments.refund", 0)
			before := e.lookup(t, "live")
			for _, f := range []Finding{FindingApplied, FindingNotApplied, FindingAbandon, FindingEscalate} {
				_, err := e.reconcileAs(t, "live", f)
				if le := wantKind(t, err, KindInProgress); le.RetryAfter <= 0 || le.Operation.FencingToken != live.FencingToken {
					t.Fatalf("Reconcile(%v) on a live lease: %+v", f, le)
				}
			}
			e.wantUnchanged(t, "live", before)
		})

		t.Run("no such operation", func(t *testing.T) {
			_, err := e.reconcileAs(t, "never", FindingApplied)
			wantKind(t, err, KindNotFound)
		})
	})
}

// TestReconcileExpiredLease: a finding about an irreversible claim past its
// lease is taken before any sweep has marked it UNKNOWN.
func TestReconcileExpiredLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		e.execute(t, "op", "expiring.refund")
		waitLeaseExpiry()
		done, err := e.reconcile(t, "op", FindingApplied, &Result{ResourceID: "r"})
		if err != nil || done.State != StateSucceeded {
			t.Fatalf("Reconcile past the lease = %+v, %v", done, err)
		}
	})
}
