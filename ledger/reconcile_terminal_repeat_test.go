package ledger

import "testing"

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
