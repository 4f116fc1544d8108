package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
)

// An attempt's effect lands but its answer is lost (ambiguous): Do marks the
// operation UNKNOWN and asks the reconciler. Meanwhile the worker's late
// Complete records the result the destination gave it (A). The reconciler
// then reports the effect with another result or resource id: the ledger
// answers ALREADY_RESOLVED and keeps A, and Do replays A. When the
// reconciler reports A itself, the ledger answers OK and Do returns A. In
// every case the destination applied the effect once, with a retry after
// the ambiguous attempt and with none (the last attempt settled).
func TestDoReplaysTheRecordedResultWhenTheReconcilerReportsAnother(t *testing.T) {
	for _, c := range []struct {
		name    string
		finding func(rid string) client.Result
	}{
		{"another result", func(rid string) client.Result {
			return client.Result{ResourceID: rid, Data: map[string]any{"receipt": rid, "status": "settled"}}
		}},
		{"another resource id", func(rid string) client.Result {
			return client.Result{ResourceID: rid + "-seen", Data: map[string]any{"receipt": rid}}
		}},
		{"no result", func(string) client.Result { return client.Result{} }},
		{"the same result", func(rid string) client.Result {
			return client.Result{ResourceID: rid, Data: map[string]any{"receipt": rid}}
		}},
	} {
		for _, retries := range []int{1, 0} {
			name := c.name
			if retries == 0 {
				name += ", last attempt"
			}
			t.Run(name, func(t *testing.T) {
				eachBackend(t, func(t *testing.T, e *env) {
					d := newDestination("timeout-after-write")
					op := e.op("refund", "payments.refund", map[string]any{"amount": 1})
					var reconciled int
					e.c.RegisterReconciler(op.Tool, func(ctx context.Context, o *client.Operation) (client.Finding, error) {
						reconciled++
						d.mu.Lock()
						rid := d.applied[o.ID][0]
						d.mu.Unlock()
						// The worker's late report of what the destination
						// answered it.
						a := client.Result{ResourceID: rid, Data: map[string]any{"receipt": rid}}
						if _, err := e.c.Complete(ctx, o.ID, o.FencingToken, a); err != nil {
							t.Errorf("the late Complete: %v", err)
						}
						return client.Finding{Kind: client.Applied, Result: c.finding(rid), Note: "found"}, nil
					})
					pol := client.ToolPolicy{Timeout: 10 * time.Second, MaxRetries: retries, Effect: client.EffectIrreversible}
					e.c.SetToolPolicy(op.Tool, pol)
					res, err := e.c.Do(e.ctx, op, d.fn)
					if n := d.count(op.ID); n != 1 {
						t.Fatalf("the destination applied the effect %d times, want 1", n)
					}
					if err != nil || res.ResourceID != "R-1" || res.Data["receipt"] != "R-1" || len(res.Data) != 1 {
						t.Fatalf("Do = %+v, %v; want the recorded result (R-1)", res, err)
					}
					if reconciled != 1 {
						t.Fatalf("the reconciler ran %d times, want 1", reconciled)
					}
					o, err := e.c.Lookup(e.ctx, op.ID)
					if err != nil {
						t.Fatal(err)
					}
					if o.State != client.StateSucceeded || o.Result == nil || o.Result.ResourceID != "R-1" || len(o.Result.Data) != 1 {
						t.Fatalf("the record = %+v", o)
					}
					for _, h := range o.History {
						if h.Reason == "RECONCILED_APPLIED" {
							t.Fatalf("the reconciler's finding is in the history: %v", reasons(o))
						}
					}
					// The agent retries the whole call: a replay, no effect.
					again, err := e.c.Do(e.ctx, op, d.fn)
					if err != nil || !again.Replayed || again.ResourceID != "R-1" || d.count(op.ID) != 1 {
						t.Fatalf("Do again = %+v, %v, %d effects", again, err, d.count(op.ID))
					}
				})
			})
		}
	}
}
