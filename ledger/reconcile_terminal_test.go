package ledger

import (
	"bytes"
	"testing"
)

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
