package faults

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// TestLostAcks checks the loss check of the fault tests on its own, with
// records a real ledger wrote and acknowledgements written out by hand.
//
// A FAILED_FINAL the ledger (RETRIES_EXHAUSTED) or a reconciler (ABANDONED)
// concluded is turned into SUCCEEDED by a late success reported with the
// latest token (contract.md §4, complete.lua): an acknowledgement of that
// FAILED_FINAL is superseded, not lost. What stays a loss: the acknowledged
// FAILED_FINAL is not in the record's history at all, or the attempt's own
// FAILED_FINAL report was acknowledged (its token can report nothing else
// afterwards), the record is at another token, or at a later attempt than
// an acknowledged terminal state.
func TestLostAcks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := redistest.Start(t)
	policy := policyYAML(time.Minute) + "tools:\n  - match: \"faults.once\"\n    max_attempts: 1\n"
	st := startStack(t, srv.Client(t), policy, ledger.Options{})
	c, err := client.Dial(st.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	must := func(o *client.Operation, err error) *client.Operation {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	// claim reserves id (EXECUTE), and its holder cannot tell how the
	// attempt went: the operation is UNKNOWN, the token still the latest.
	claim := func(id, tool string) *client.Operation {
		t.Helper()
		o := op(id)
		o.Tool = tool
		r, err := c.Reserve(ctx, o, "h-"+id)
		if err != nil || r.Decision != client.DecisionExecute {
			t.Fatalf("Reserve(%s) = %+v, %v", id, r, err)
		}
		must(c.MarkUnknown(ctx, id, r.Operation.FencingToken, "no answer"))
		return r.Operation
	}
	late := func(id string, tok uint64) {
		t.Helper()
		if o := must(c.Complete(ctx, id, tok, client.Result{ResourceID: "ch-" + id})); o.State != client.StateSucceeded {
			t.Fatalf("late Complete(%s) = %v", id, o.State)
		}
	}
	ackOf := func(k kind, o *client.Operation) ack {
		return ack{Kind: k, ID: o.ID, State: int(o.State), Attempt: o.Attempt, Token: o.FencingToken, Reason: o.Reason}
	}

	// Abandoned by a reconciler, then the attempt's late success.
	a := claim("abandoned", tool)
	abandoned := must(c.Reconcile(ctx, "abandoned", client.Finding{Kind: client.Abandon, Note: "not found"}))
	late("abandoned", a.FencingToken)

	// Out of attempts (max 1) after a reconciler found nothing, then the
	// attempt's late success.
	e := claim("exhausted", "faults.once")
	must(c.Reconcile(ctx, "exhausted", client.Finding{Kind: client.NotApplied, Note: "not found"}))
	r, err := c.Reserve(ctx, client.Op{ID: "exhausted", Tool: "faults.once", Params: op("exhausted").Params, PermitID: "permit-1"}, "h-other")
	if err != nil || r.Operation.State != client.StateFailedFinal || r.Operation.Reason != "RETRIES_EXHAUSTED" {
		t.Fatalf("Reserve after the last attempt = %+v, %v", r, err)
	}
	late("exhausted", e.FencingToken)

	// The attempt's late success from UNKNOWN, no FAILED_FINAL ever.
	d := claim("direct", tool)
	late("direct", d.FencingToken)

	// A retryable failure, then a second attempt that succeeds.
	r1, err := c.Reserve(ctx, op("again"), "h-again")
	if err != nil || r1.Decision != client.DecisionExecute {
		t.Fatalf("Reserve(again) = %+v, %v", r1, err)
	}
	must(c.Fail(ctx, "again", r1.Operation.FencingToken, false, client.Failure{Code: "retryable"}))
	r2, err := c.Reserve(ctx, op("again"), "h-again-2")
	if err != nil || r2.Decision != client.DecisionExecute || r2.Operation.Attempt != 2 {
		t.Fatalf("second Reserve(again) = %+v, %v", r2, err)
	}
	late("again", r2.Operation.FencingToken)

	superseded := []ack{
		ackOf(kReconcile, abandoned),
		{Kind: kMarkUnknown, ID: "abandoned", State: stFailed, Attempt: a.Attempt, Token: a.FencingToken, Reason: "ABANDONED"},
		ackOf(kReserve, r.Operation),
		{Kind: kLookup, ID: "exhausted", State: stFailed, Attempt: e.Attempt, Token: e.FencingToken, Reason: "RETRIES_EXHAUSTED"},
	}
	lost := []ack{
		// The attempt's own FAILED_FINAL report acknowledged: a success
		// with its token would have been COMPLETION_CONFLICT.
		{Kind: kComplete, ID: "abandoned", Outcome: outFinal, State: stFailed, Attempt: a.Attempt, Token: a.FencingToken, Reason: "ABANDONED"},
		// A FAILED_FINAL the attempt reported itself (then no success can
		// follow), not the one the history has.
		{Kind: kLookup, ID: "abandoned", State: stFailed, Attempt: a.Attempt, Token: a.FencingToken, Reason: "FAILED_FINAL"},
		// An abandon the record's history does not have.
		{Kind: kReconcile, ID: "direct", Finding: findAbandon, State: stFailed, Attempt: d.Attempt, Token: d.FencingToken, Reason: "ABANDONED"},
		// The record is at another token.
		{Kind: kReconcile, ID: "exhausted", Finding: findAbandon, State: stFailed, Attempt: e.Attempt, Token: e.FencingToken + 1, Reason: "ABANDONED"},
		// A terminal state at an attempt the record has left: no claim
		// follows a terminal state, so the store lost it and ran the
		// operation again.
		{Kind: kComplete, ID: "again", Outcome: outSucceeded, State: stSucceeded, Attempt: 1, Token: r1.Operation.FencingToken, Reason: "SUCCEEDED"},
	}

	var reports []string
	n, checked := lostAcks(ctx, t, c, superseded, func(s string) { reports = append(reports, s) })
	if n != 0 || len(reports) != 0 {
		t.Errorf("superseded acknowledgements counted as lost: %d\n%s", n, strings.Join(reports, "\n"))
	}
	if checked["Reconcile"] != 1 || checked["MarkUnknown"] != 1 || checked["Reserve"] != 1 || checked["Lookup"] != 1 {
		t.Errorf("checked = %v", checked)
	}

	reports = nil
	n, _ = lostAcks(ctx, t, c, lost, func(s string) { reports = append(reports, s) })
	if n != len(lost) || len(reports) != len(lost) {
		t.Errorf("lost %d of %d acknowledgements that the records do not show:\n%s", n, len(lost), strings.Join(reports, "\n"))
	}
}
