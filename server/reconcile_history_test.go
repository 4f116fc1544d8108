package server_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// TestReconcileCarriesHistory: the operation in Reconcile's response carries
// its history, the same as Lookup's right after, so a reconciler sees what
// its finding recorded without another call.
func TestReconcileCarriesHistory(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		id := e.id("refund")
		res, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", nil, newHolder()))
		if err != nil || res.GetDecision() != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("Reserve = %v, %v", res, err)
		}
		tok := res.GetOperation().GetFencingToken()
		if _, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: tok, Reason: "timeout"}); err != nil {
			t.Fatal(err)
		}
		rec, err := e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_ESCALATE,
			Note: "finance must check", FencingToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		h := rec.GetOperation().GetHistory()
		if len(h) != 3 {
			t.Fatalf("Reconcile's history has %d entries, want 3: %v", len(h), h)
		}
		if last := h[2]; last.GetReason() != "ESCALATED" || last.GetDetail() != "finance must check" || last.GetFencingToken() != tok ||
			last.GetFromState() != ledgerv1.State_STATE_UNKNOWN || last.GetToState() != ledgerv1.State_STATE_UNKNOWN {
			t.Errorf("latest entry = %v", last)
		}
		look, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: id})
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(rec.GetOperation(), look.GetOperation()) {
			t.Errorf("Reconcile's operation\n%v\ndiffers from Lookup's\n%v", rec.GetOperation(), look.GetOperation())
		}
	})
}
