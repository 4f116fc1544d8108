package ledger

import (
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
