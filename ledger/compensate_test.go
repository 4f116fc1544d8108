package ledger

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"
)

// compensate reserves id as a compensation of target.
func (e *env) compensate(id, tool, target, run string) (*ReserveResult, error) {
	return e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: id, Tool: tool, PermitID: "permit-1",
		Holder: "h-" + id, Params: map[string]any{"amount": 10.0}, Compensates: target, RunID: run})
}

// charged is a charge that succeeded once at the destination.
func (e *env) charged(t *testing.T, id string) *Operation {
	t.Helper()
	o := e.execute(t, id, "payments.charge")
	return e.settle(t, id, o.FencingToken, OutcomeSucceeded, "ch-"+id)
}

// TestCompensation: a refund compensating a charge runs once however often
// it is retried, and each record names the other; one operation takes
// several compensations, each its own operation.
func TestCompensation(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		e.charged(t, "charge-1")
		refunds := 0 // effects at the fake destination
		for try := 0; try < 3; try++ {
			res, err := e.compensate("refund-1", "payments.refund", "charge-1", "")
			if err != nil {
				t.Fatalf("try %d: %v", try, err)
			}
			if res.Operation.Compensates != "charge-1" {
				t.Fatalf("refund compensates %q, want charge-1", res.Operation.Compensates)
			}
			if res.Decision == DecisionExecute {
				refunds++
				e.settle(t, "refund-1", res.Operation.FencingToken, OutcomeSucceeded, "re-1")
			}
		}
		if refunds != 1 {
			t.Fatalf("the refund applied %d times, want 1", refunds)
		}
		if got := e.lookup(t, "charge-1").CompensatedBy; !slices.Equal(got, []string{"refund-1"}) {
			t.Fatalf("charge compensated by %q, want [refund-1]", got)
		}
		// A second, partial refund is its own operation; the charge's other
		// fields do not move.
		before := e.lookup(t, "charge-1")
		if _, err := e.compensate("refund-2", "payments.refund", "charge-1", ""); err != nil {
			t.Fatal(err)
		}
		after := e.lookup(t, "charge-1")
		if !slices.Equal(after.CompensatedBy, []string{"refund-1", "refund-2"}) {
			t.Fatalf("charge compensated by %q", after.CompensatedBy)
		}
		after.CompensatedBy = before.CompensatedBy
		if !reflect.DeepEqual(after, before) {
			t.Fatalf("the link changed the charge:\nbefore %+v\nafter  %+v", before, after)
		}
		// A compensation can itself be compensated.
		if _, err := e.compensate("recharge-1", "payments.charge", "refund-1", ""); err != nil {
			t.Fatal(err)
		}
		if got := e.lookup(t, "refund-1"); got.Compensates != "charge-1" || !slices.Equal(got.CompensatedBy, []string{"recharge-1"}) {
			t.Fatalf("refund-1: compensates %q, compensated by %q", got.Compensates, got.CompensatedBy)
		}
	})
}

// TestCompensationRefused: a compensation of an operation that did not
// succeed, or cannot take one more, is refused with its cause, and changes
// neither record; a Reserve refused after the link takes the link back.
func TestCompensationRefused(t *testing.T) {
	type setup func(t *testing.T, e *env) (target string)
	succeeded := func(t *testing.T, e *env) string { e.charged(t, "target"); return "target" }
	cases := []struct {
		name  string
		setup setup
		// call reserves "comp" against target; nil: the plain compensation.
		call  func(e *env, target string) error
		kind  Kind
		cause string
		state State
	}{
		{name: "running", setup: func(t *testing.T, e *env) string { e.execute(t, "target", "payments.charge"); return "target" },
			kind: KindNotCompensable, cause: "not_succeeded", state: StateRunning},
		{name: "unknown", setup: func(t *testing.T, e *env) string {
			e.unknown(t, "target", e.execute(t, "target", "payments.charge").FencingToken)
			return "target"
		}, kind: KindNotCompensable, cause: "not_succeeded", state: StateUnknown},
		{name: "failed final", setup: func(t *testing.T, e *env) string {
			e.settle(t, "target", e.execute(t, "target", "payments.charge").FencingToken, OutcomeFailedFinal, "card_declined")
			return "target"
		}, kind: KindNotCompensable, cause: "not_succeeded", state: StateFailedFinal},
		{name: "no such operation", setup: func(*testing.T, *env) string { return "target" },
			kind: KindNotCompensable, cause: "not_found"},
		{name: "expired", setup: func(t *testing.T, e *env) string {
			o := e.execute(t, "target", "brief.charge")
			o = e.settle(t, "target", o.FencingToken, OutcomeSucceeded, "x")
			time.Sleep(time.Until(o.ExpiresAt) + 50*time.Millisecond)
			return "target"
		}, kind: KindNotCompensable, cause: "expired", state: StateSucceeded},
		{name: "itself", setup: succeeded, call: func(e *env, _ string) error {
			_, err := e.compensate("target", "payments.refund", "target", "")
			return err
		}, kind: KindInvalid},
		{name: "the limit", setup: func(t *testing.T, e *env) string {
			e.charged(t, "target")
			for i := range MaxCompensations {
				if _, err := e.compensate(fmt.Sprintf("part-%02d", i), "payments.refund", "target", ""); err != nil {
					t.Fatal(err)
				}
			}
			return "target"
		}, kind: KindNotCompensable, cause: "limit", state: StateSucceeded},
		{name: "another target under the same id", setup: func(t *testing.T, e *env) string {
			e.charged(t, "first")
			if _, err := e.compensate("comp", "payments.refund", "first", ""); err != nil {
				t.Fatal(err)
			}
			return succeeded(t, e)
		}, kind: KindKeyReused},
		{name: "refused by its run", setup: func(t *testing.T, e *env) string {
			e.startRun(t, "run-1", RunLimits{MaxSteps: 1})
			if _, err := e.step(t, "run-1", "step-1", "payments.charge", nil); err != nil {
				t.Fatal(err)
			}
			return succeeded(t, e)
		}, call: func(e *env, target string) error {
			_, err := e.compensate("comp", "payments.refund", target, "run-1")
			return err
		}, kind: KindRunEnded},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, e *env) {
				target := c.setup(t, e)
				before, _ := e.l.Lookup(e.ctx, e.who, target)
				var compBefore *Operation
				if o, err := e.l.Lookup(e.ctx, e.who, "comp"); err == nil {
					compBefore = o
				}
				call := c.call
				if call == nil {
					call = func(e *env, target string) error {
						_, err := e.compensate("comp", "payments.refund", target, "")
						return err
					}
				}
				le := wantKind(t, call(e, target), c.kind)
				if le.Cause != c.cause || c.kind == KindNotCompensable && le.State != c.state {
					t.Fatalf("cause %q, state %v; want %q, %v", le.Cause, le.State, c.cause, c.state)
				}
				if c.kind == KindKeyReused && !slices.Equal(le.Differs, []string{"compensates"}) {
					t.Fatalf("differs %q, want [compensates]", le.Differs)
				}
				if before != nil {
					e.wantUnchanged(t, target, before)
				}
				if compBefore != nil {
					e.wantUnchanged(t, "comp", compBefore)
				} else if _, err := e.l.Lookup(e.ctx, e.who, "comp"); KindOf(err) != KindNotFound {
					t.Fatalf("Lookup(comp) = %v, want not found", err)
				}
			})
		})
	}
}
