package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// While a worker's fn is still finishing, its lease ends (no renewal gets
// through), a reconciler finds nothing at the destination yet and records
// NOT_APPLIED, and another caller runs the operation again. Then the
// worker's effect lands: the destination applied it twice, and the ledger
// records the other attempt's outcome. Do must not call that "not recorded,
// reconciles as applied": it returns fn's result with a
// *ConflictingOutcomeError that shows the record that stands and asks for a
// human (ErrNeedsReconciliation), never ErrCompletionNotRecorded.
func TestDoSaysWhenTheLedgerRecordsAnotherOutcomeThanTheEffect(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t), ledgerFault("Renew", "unavailable"))
	other, err := client.Dial(e.stack.Addr, fast)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	d := newDestination()
	op := e.op("refund", "short.refund", map[string]any{"amount": 1})
	op.Effect = client.EffectIrreversible
	bg := context.Background()

	res, err := e.c.Do(bg, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		// The lease ends; the ledger's sweep turns the operation UNKNOWN.
		for stop := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if o, err := other.Lookup(bg, op.ID); err == nil && o.State == client.StateUnknown {
				break
			}
			if time.Now().After(stop) {
				t.Error("the operation never became UNKNOWN")
				return client.Result{}, client.MarkRetryable(errors.New("test setup"))
			}
		}
		if _, err := other.Reconcile(bg, op.ID, client.Finding{Kind: client.NotApplied, FencingToken: a.FencingToken, Note: "not found"}); err != nil {
			t.Errorf("Reconcile(not applied): %v", err)
		}
		if r, err := other.Do(bg, op, d.fn); err != nil || r.Replayed {
			t.Errorf("the other caller's Do = %+v, %v; want a new attempt", r, err)
		}
		return d.fn(ctx, a) // this attempt's effect lands now
	})
	if n := d.count(op.ID); n != 2 {
		t.Fatalf("the destination applied the effect %d times, want 2 (the case to report)", n)
	}
	var ce *client.ConflictingOutcomeError
	if !errors.As(err, &ce) || !errors.Is(err, client.ErrConflictingOutcome) || !errors.Is(err, client.ErrNeedsReconciliation) {
		t.Fatalf("Do = %+v, %v; want a *ConflictingOutcomeError", res, err)
	}
	if errors.Is(err, client.ErrCompletionNotRecorded) {
		t.Fatalf("Do: %v matches ErrCompletionNotRecorded, which says the effect will be reconciled as applied", err)
	}
	if res.ResourceID != "R-2" || res.Replayed {
		t.Fatalf("Do's result = %+v; want fn's (R-2)", res)
	}
	if o := ce.Operation; o == nil || o.State != client.StateSucceeded || o.Attempt != 2 || o.Result == nil || o.Result.ResourceID != "R-1" {
		t.Fatalf("the record that stands = %+v; want the other attempt's SUCCEEDED (R-1)", o)
	}
	if c := client.ClassOf(err); c == client.Retryable {
		t.Fatalf("ClassOf = %v", c)
	}
}
