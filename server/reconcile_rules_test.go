package server_test

import (
	"testing"

	"google.golang.org/grpc/codes"

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

// TestReconcileRules: SPEC §4's rules for Reconcile: accepted from UNKNOWN
// and from RUNNING past its lease, OPERATION_IN_PROGRESS on a live lease;
// APPLIED → SUCCEEDED with the result, NOT_APPLIED → PENDING, ABANDON →
// FAILED_FINAL, ESCALATE → UNKNOWN for review; on a terminal record the same
// finding succeeds again and another is ALREADY_RESOLVED.
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
						// Flagged for a human: an irreversible operation
						// waits for the review, an idempotent one is
						// reclaimed as from any UNKNOWN (design.md, 3.3).
						if from.tool == "short.idempotent" {
							if res.Decision != execute || res.Operation.NeedsReview {
								t.Fatalf("ESCALATE, then Reserve = %v, want EXECUTE", res)
							}
						} else if res.Decision != reconcile || !e.lookup(t, id).NeedsReview {
							t.Fatalf("ESCALATE, then Reserve = %v, want RECONCILE, still flagged", res)
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

		terminals := []struct {
			name  string
			state ledgerv1.State
			same  ledgerv1.Finding
			setup func(id string)
		}{
			{"SUCCEEDED by APPLIED", succeeded, applied, func(id string) {
				e.markUnknown(t, id, e.claim(t, id, "payments.refund", 0).FencingToken)
				if _, err := e.reconcileAs(t, id, applied); err != nil {
					t.Fatal(err)
				}
			}},
			{"SUCCEEDED by Complete", succeeded, applied, func(id string) {
				e.complete(t, id, e.claim(t, id, "payments.refund", 0).FencingToken, outSucceeded, "R-1")
			}},
			{"FAILED_FINAL by ABANDON", failed, abandon, func(id string) {
				e.markUnknown(t, id, e.claim(t, id, "payments.refund", 0).FencingToken)
				if _, err := e.reconcileAs(t, id, abandon); err != nil {
					t.Fatal(err)
				}
			}},
			{"FAILED_FINAL by Complete", failed, abandon, func(id string) {
				e.complete(t, id, e.claim(t, id, "payments.refund", 0).FencingToken, outFailed, "declined")
			}},
			{"FAILED_FINAL by RETRIES_EXHAUSTED", failed, abandon, func(id string) {
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
				for _, f := range []ledgerv1.Finding{applied, notApplied, abandon, escalate} {
					op, err := e.reconcileAs(t, id, f)
					if f == tc.same {
						if err != nil || op.State != tc.state {
							t.Fatalf("the same finding (%v) again = %v, %v", f, op, err)
						}
						continue
					}
					if ei := wantReason(t, err, codes.FailedPrecondition, "ALREADY_RESOLVED"); ei.Metadata["state"] != tc.state.String() {
						t.Fatalf("%v: metadata %v", f, ei.Metadata)
					}
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
