package server_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

const (
	applied    = ledgerv1.Finding_FINDING_APPLIED
	notApplied = ledgerv1.Finding_FINDING_NOT_APPLIED
	abandon    = ledgerv1.Finding_FINDING_ABANDON
	escalate   = ledgerv1.Finding_FINDING_ESCALATE
)

// reconcileAs records finding f about id with a note, a result (APPLIED) or
// a failure (ABANDON), and returns the operation in the response.
func (e *env) reconcileAs(t *testing.T, id string, f ledgerv1.Finding) (*ledgerv1.Operation, error) {
	t.Helper()
	req := &ledgerv1.ReconcileRequest{OperationId: id, Finding: f, Note: "checked the destination"}
	switch f {
	case applied:
		req.Result = &ledgerv1.Result{ResourceId: "R-found", Data: mustStruct(t, map[string]any{"receipt": "R-found"})}
	case abandon:
		req.Failure = &ledgerv1.Failure{Code: "gave_up", Message: "nothing at the destination"}
	}
	res, err := e.c.Reconcile(e.ctx, req)
	return res.GetOperation(), err
}

// TestReconcileRules: contract.md §4's rules for Reconcile: accepted from UNKNOWN
// and from RUNNING past its lease, OPERATION_IN_PROGRESS on a live lease;
// APPLIED → SUCCEEDED with the result, NOT_APPLIED → PENDING, ABANDON →
// FAILED_FINAL, ESCALATE → UNKNOWN for review; on a terminal record the same
// finding (the same kind with the outcome that stands) succeeds again and
// another, of the same kind with another outcome too, is ALREADY_RESOLVED.
func TestReconcileRules(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		froms := []struct {
			name  string
			tool  string
			from  ledgerv1.State
			setup func(id, tool string)
		}{
			{"UNKNOWN by MarkUnknown", "payments.refund", unknown, func(id, tool string) {
				e.markUnknown(t, id, e.claim(t, id, tool, 0).FencingToken)
			}},
			{"UNKNOWN by lease expiry", "short.refund", unknown, func(id, tool string) {
				op := e.claim(t, id, tool, 0)
				e.waitLeaseEnd(t, op)
				if res := e.reserveAs(t, id, tool, 0, newHolder()); res.Decision != reconcile {
					t.Fatalf("Reserve after the lease = %v", res.Decision)
				}
			}},
			{"RUNNING past lease, idempotent", "short.idempotent", running, func(id, tool string) {
				e.waitLeaseEnd(t, e.claim(t, id, tool, 0))
			}},
		}
		for _, from := range froms {
			for _, f := range []ledgerv1.Finding{applied, notApplied, abandon, escalate} {
				name := from.name + " " + f.String()
				t.Run(name, func(t *testing.T) {
					id := e.id(name)
					from.setup(id, from.tool)
					if st := e.lookup(t, id).State; st != from.from {
						t.Fatalf("state %v before the finding, want %v", st, from.from)
					}
					op, err := e.reconcileAs(t, id, f)
					if err != nil {
						t.Fatalf("Reconcile(%v) from %s: %v", f, from.name, err)
					}
					want := map[ledgerv1.Finding]struct {
						state  ledgerv1.State
						reason string
					}{
						applied:    {succeeded, "RECONCILED_APPLIED"},
						notApplied: {pending, "RECONCILED_NOT_APPLIED"},
						abandon:    {failed, "ABANDONED"},
						escalate:   {unknown, "ESCALATED"},
					}[f]
					h := op.History[len(op.History)-1]
					if op.State != want.state || op.Reason != want.reason || h.Reason != want.reason || h.FromState != from.from ||
						h.ToState != want.state || h.Detail != "checked the destination" || h.Principal != "anonymous" {
						t.Fatalf("Reconcile(%v) = %v", f, op)
					}
					if op.LeaseExpiresAt != nil {
						t.Fatalf("a lease is left: %v", op.LeaseExpiresAt)
					}
					// What the next Reserve decides is the business outcome.
					res := e.reserveAs(t, id, from.tool, 0, newHolder())
					switch f {
					case applied:
						if op.Result.GetResourceId() != "R-found" || op.Result.GetData().GetFields()["receipt"].GetStringValue() != "R-found" ||
							res.Decision != replay || res.Operation.Result.GetResourceId() != "R-found" {
							t.Fatalf("APPLIED: %v, then Reserve = %v", op, res)
						}
					case notApplied:
						if res.Decision != execute || res.Operation.Attempt != 2 {
							t.Fatalf("NOT_APPLIED, then Reserve = %v, want EXECUTE attempt 2", res)
						}
					case abandon:
						if op.Failure.GetCode() != "gave_up" || res.Decision != replay || res.Operation.Failure.GetCode() != "gave_up" {
							t.Fatalf("ABANDON: %v, then Reserve = %v", op, res)
						}
					case escalate:
						if !op.NeedsReview || op.UnknownSince == nil {
							t.Fatalf("ESCALATE: %v", op)
						}
						// Flagged for a human: whatever its effect, the
						// operation waits for a finding (design.md, 3.3).
						if res.Decision != reconcile || !e.lookup(t, id).NeedsReview {
							t.Fatalf("ESCALATE, then Reserve = %v, want RECONCILE, still flagged", res)
						}
						if op, err := e.reconcileAs(t, id, notApplied); err != nil || op.State != pending || op.NeedsReview {
							t.Fatalf("NOT_APPLIED after ESCALATE = %v, %v", op, err)
						}
						if res := e.reserveAs(t, id, from.tool, 0, newHolder()); res.Decision != execute {
							t.Fatalf("ESCALATE, NOT_APPLIED, then Reserve = %v, want EXECUTE", res)
						}
					}
				})
			}
		}

		t.Run("ESCALATE, then a finding clears the review flag", func(t *testing.T) {
			id := e.id("escalated")
			e.markUnknown(t, id, e.claim(t, id, "payments.refund", 0).FencingToken)
			if _, err := e.reconcileAs(t, id, escalate); err != nil {
				t.Fatal(err)
			}
			op, err := e.reconcileAs(t, id, applied)
			if err != nil || op.State != succeeded || op.NeedsReview {
				t.Fatalf("APPLIED after ESCALATE = %v, %v", op, err)
			}
		})

		t.Run("live lease", func(t *testing.T) {
			id := e.id("live")
			e.claim(t, id, "payments.refund", 0)
			before := e.lookup(t, id)
			for _, f := range []ledgerv1.Finding{applied, notApplied, abandon, escalate} {
				_, err := e.reconcileAs(t, id, f)
				wantReason(t, err, codes.FailedPrecondition, "OPERATION_IN_PROGRESS")
				if !hasRetryInfo(err) {
					t.Fatalf("OPERATION_IN_PROGRESS (%v) without RetryInfo", f)
				}
			}
			e.wantUnchanged(t, id, before)
		})

		// On a terminal record the same finding is the same kind with the
		// outcome that stands (the result data and resource id, or the
		// failure code and message), however the record got there; a
		// finding of that kind with another outcome is ALREADY_RESOLVED.
		result := func(rid, receipt string) *ledgerv1.Result {
			return &ledgerv1.Result{ResourceId: rid, Data: mustStruct(t, map[string]any{"receipt": receipt})}
		}
		appliedWith := func(r *ledgerv1.Result) *ledgerv1.ReconcileRequest {
			return &ledgerv1.ReconcileRequest{Finding: applied, Result: r, Note: "checked again"}
		}
		abandonWith := func(code, msg string) *ledgerv1.ReconcileRequest {
			return &ledgerv1.ReconcileRequest{Finding: abandon, Failure: &ledgerv1.Failure{Code: code, Message: msg}, Note: "checked again"}
		}
		succeededOthers := []*ledgerv1.ReconcileRequest{
			appliedWith(result("R-found", "R-other")), appliedWith(result("R-other", "R-found")),
			appliedWith(&ledgerv1.Result{ResourceId: "R-found"}), appliedWith(nil),
		}
		terminals := []struct {
			name   string
			state  ledgerv1.State
			kind   ledgerv1.Finding
			same   *ledgerv1.ReconcileRequest   // answered OK
			others []*ledgerv1.ReconcileRequest // of the same kind, ALREADY_RESOLVED
			setup  func(id string)
		}{
			{"SUCCEEDED by APPLIED", succeeded, applied, appliedWith(result("R-found", "R-found")), succeededOthers, func(id string) {
				e.markUnknown(t, id, e.claim(t, id, "payments.refund", 0).FencingToken)
				if _, err := e.reconcileAs(t, id, applied); err != nil {
					t.Fatal(err)
				}
			}},
			{"SUCCEEDED by Complete", succeeded, applied, appliedWith(result("R-1", "R-1")),
				[]*ledgerv1.ReconcileRequest{appliedWith(result("R-found", "R-found")), appliedWith(result("R-1", "R-2")),
					appliedWith(result("R-2", "R-1")), appliedWith(nil)},
				func(id string) {
					e.complete(t, id, e.claim(t, id, "payments.refund", 0).FencingToken, outSucceeded, "R-1")
				}},
			{"FAILED_FINAL by ABANDON", failed, abandon, abandonWith("gave_up", "nothing at the destination"),
				[]*ledgerv1.ReconcileRequest{abandonWith("other", "nothing at the destination"), abandonWith("gave_up", "another message"),
					abandonWith("gave_up", ""), {Finding: abandon}},
				func(id string) {
					e.markUnknown(t, id, e.claim(t, id, "payments.refund", 0).FencingToken)
					if _, err := e.reconcileAs(t, id, abandon); err != nil {
						t.Fatal(err)
					}
				}},
			{"FAILED_FINAL by ABANDON without a failure", failed, abandon, abandonWith("ABANDONED", ""),
				[]*ledgerv1.ReconcileRequest{abandonWith("gave_up", ""), abandonWith("ABANDONED", "nothing at the destination")},
				func(id string) {
					e.markUnknown(t, id, e.claim(t, id, "payments.refund", 0).FencingToken)
					if _, err := e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: abandon}); err != nil {
						t.Fatal(err)
					}
				}},
			// The worker's final failure and the ledger's own conclusion
			// stand as well: an ABANDON agrees only when it reports them.
			{"FAILED_FINAL by Complete", failed, abandon, abandonWith("declined", "refused by the destination"),
				[]*ledgerv1.ReconcileRequest{{Finding: abandon}, abandonWith("gave_up", "nothing at the destination"),
					abandonWith("declined", "")},
				func(id string) {
					e.complete(t, id, e.claim(t, id, "payments.refund", 0).FencingToken, outFailed, "declined")
				}},
			{"FAILED_FINAL by RETRIES_EXHAUSTED", failed, abandon, abandonWith("RETRIES_EXHAUSTED", "the policy allows 3 attempts"),
				[]*ledgerv1.ReconcileRequest{{Finding: abandon}, abandonWith("gave_up", "nothing at the destination")},
				func(id string) {
					for range 3 {
						e.complete(t, id, e.claim(t, id, "payments.refund", 0).FencingToken, outRetryable, "503")
					}
					if res := e.reserveAs(t, id, "payments.refund", 0, newHolder()); res.Operation.Reason != "RETRIES_EXHAUSTED" {
						t.Fatalf("Reserve with no attempts left = %v", res)
					}
				}},
		}
		for _, tc := range terminals {
			t.Run("terminal: "+tc.name, func(t *testing.T) {
				id := e.id(tc.name)
				tc.setup(id)
				before := e.lookup(t, id)
				tc.same.OperationId = id
				res, err := e.c.Reconcile(e.ctx, tc.same)
				if err != nil || res.Operation.State != tc.state || !proto.Equal(res.Operation.Result, before.Result) ||
					!proto.Equal(res.Operation.Failure, before.Failure) {
					t.Fatalf("the same finding (%v) again = %v, %v; the record holds %v", tc.same, res.GetOperation(), err, before)
				}
				alreadyResolved := func(what string, err error) {
					t.Helper()
					if ei := wantReason(t, err, codes.FailedPrecondition, "ALREADY_RESOLVED"); ei.Metadata["state"] != tc.state.String() {
						t.Fatalf("%s: metadata %v", what, ei.Metadata)
					}
					if msg := status.Convert(err).Message(); !strings.Contains(msg, "another finding or outcome") {
						t.Fatalf("%s: message %q", what, msg)
					}
				}
				for _, f := range []ledgerv1.Finding{applied, notApplied, abandon, escalate} {
					if f != tc.kind {
						_, err := e.reconcileAs(t, id, f)
						alreadyResolved(f.String(), err)
					}
				}
				for _, req := range tc.others {
					req.OperationId = id
					_, err := e.c.Reconcile(e.ctx, req)
					alreadyResolved(req.String(), err)
				}
				e.wantUnchanged(t, id, before)
			})
		}
	})
}

// TestHistoryOfEveryTransition: every transition is in Lookup's history
// with its time, from and to states, attempt, token, principal and reason,
// oldest first.
func TestHistoryOfEveryTransition(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		id := e.id("refund")
		first := e.claim(t, id, "payments.refund", 0)
		e.complete(t, id, first.FencingToken, outRetryable, "503")
		second := e.claim(t, id, "payments.refund", 0)
		e.markUnknown(t, id, second.FencingToken)
		if _, err := e.reconcileAs(t, id, escalate); err != nil {
			t.Fatal(err)
		}
		if _, err := e.reconcileAs(t, id, applied); err != nil {
			t.Fatal(err)
		}
		op := e.lookup(t, id)
		want := []struct {
			from, to ledgerv1.State
			attempt  uint32
			token    uint64
			reason   string
			detail   string
		}{
			{ledgerv1.State_STATE_UNSPECIFIED, running, 1, first.FencingToken, "RESERVED", ""},
			{running, pending, 1, first.FencingToken, "FAILED_RETRYABLE", ""},
			{pending, running, 2, second.FencingToken, "CLAIMED", ""},
			{running, unknown, 2, second.FencingToken, "MARKED_UNKNOWN", "timeout"},
			{unknown, unknown, 2, second.FencingToken, "ESCALATED", "checked the destination"},
			{unknown, succeeded, 2, second.FencingToken, "RECONCILED_APPLIED", "checked the destination"},
		}
		if len(op.History) != len(want) {
			t.Fatalf("history has %d entries, want %d: %v", len(op.History), len(want), op.History)
		}
		prev := op.CreatedAt.AsTime()
		for i, w := range want {
			h := op.History[i]
			if h.FromState != w.from || h.ToState != w.to || h.Attempt != w.attempt || h.FencingToken != w.token ||
				h.Reason != w.reason || h.Detail != w.detail || h.Principal != "anonymous" {
				t.Errorf("entry %d = %v, want %+v", i, h, w)
			}
			if h.Time == nil || h.Time.AsTime().Before(prev) {
				t.Errorf("entry %d at %v, before the previous entry or the creation (%v)", i, h.Time.AsTime(), prev)
			}
			prev = h.Time.AsTime()
		}
		if !op.UpdatedAt.AsTime().Equal(prev) {
			t.Errorf("updated_at %v, the latest entry at %v", op.UpdatedAt.AsTime(), prev)
		}
	})
}

// eachUnsweptBackend runs f on a redis-server and an embedded engine of its
