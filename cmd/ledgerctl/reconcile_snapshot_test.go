package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// TestReconcileSnapshot: reconcile prints the record its own call left,
// with the history from Reconcile's answer, and reads nothing else: an
// agent that claims the operation again right after a not-applied finding
// does not turn what is printed into "not-applied → RUNNING". Against a
// ledger whose answer has no history, ledgerctl reads the record with
// Lookup for it.
func TestReconcileSnapshot(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		e := newLedgerEnv(t, rdb)
		ctx := context.Background()

		id := "wf-1:refund"
		e.markUnknown(t, id, "payments.refund", "gateway timeout")
		p, addr := startProxy(t, e.addr, false)
		p.afterReconcile = func() {
			r, err := e.sdk.Reserve(ctx, client.Op{ID: id, Tool: "payments.refund", PermitID: "approval-1", RunID: "run-1", Step: 2,
				Params: map[string]any{"amount": 1250}}, client.NewHolder())
			if err != nil || r.Decision != client.DecisionExecute {
				t.Errorf("Reserve after the finding = %+v, %v", r, err)
			}
		}
		env := map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"]}
		o := must(t, env, "reconcile", id, "not-applied", "--note", "no refund at the bank")
		if !strings.HasPrefix(o.stdout, "reconciled "+id+": not-applied → PENDING\n") ||
			!strings.Contains(o.stdout, "state              PENDING") ||
			!strings.Contains(o.stdout, "RECONCILED_NOT_APPLIED") || !strings.Contains(o.stdout, "no refund at the bank") ||
			strings.Contains(o.stdout, "CLAIMED") {
			t.Errorf("reconcile not-applied, then a claim:\n%s", o)
		}
		if _, lookups := p.take(); lookups != 0 {
			t.Errorf("reconcile called Lookup %d times, want none", lookups)
		}

		// A ledger that answers without the history.
		old := "wf-2:refund"
		e.markUnknown(t, old, "payments.refund", "gateway timeout")
		p, addr = startProxy(t, e.addr, true)
		env = map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"]}
		o = must(t, env, "reconcile", old, "escalate", "--note", "finance must check")
		if !strings.HasPrefix(o.stdout, "reconciled "+old+": escalate → UNKNOWN (needs review)\n") ||
			!strings.Contains(o.stdout, "history (oldest first):") || !strings.Contains(o.stdout, "ESCALATED") ||
			!strings.Contains(o.stdout, "finance must check") {
			t.Errorf("reconcile escalate with an older ledger:\n%s", o)
		}
		if _, lookups := p.take(); lookups != 1 {
			t.Errorf("reconcile with an older ledger called Lookup %d times, want 1", lookups)
		}
	})
}
