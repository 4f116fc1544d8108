package server_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// waitState waits until Lookup shows id in state st.
func (e *env) waitState(t *testing.T, id string, st ledgerv1.State) *ledgerv1.Operation {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		op := e.lookup(t, id)
		if op.State == st {
			return op
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed %v, want %v", id, op.State, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCompleteRules: contract.md §4's rules for Complete: only the current token,
// from RUNNING and from UNKNOWN with the latest token, a retryable failure
// back to PENDING, a repeat of the same outcome succeeds, another outcome is
// COMPLETION_CONFLICT.
func TestCompleteRules(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		t.Run("from RUNNING", func(t *testing.T) {
			id := e.id("running")
			op := e.claim(t, id, "payments.refund", 0)
			done := e.complete(t, id, op.FencingToken, outSucceeded, "R-1")
			if done.State != succeeded || done.Result.GetResourceId() != "R-1" || done.LeaseExpiresAt != nil {
				t.Fatalf("Complete = %v", done)
			}
			if h := e.lastEntry(t, id); h.Reason != "SUCCEEDED" || h.FromState != running || h.ToState != succeeded {
				t.Fatalf("history = %v", h)
			}
		})

		t.Run("from UNKNOWN by MarkUnknown, latest token", func(t *testing.T) {
			for _, outcome := range []ledgerv1.Outcome{outSucceeded, outFailed} {
				id := e.id("marked-" + outcome.String())
				op := e.claim(t, id, "payments.refund", 0)
				e.markUnknown(t, id, op.FencingToken)
				done := e.complete(t, id, op.FencingToken, outcome, "late")
				want := map[ledgerv1.Outcome]ledgerv1.State{outSucceeded: succeeded, outFailed: failed}[outcome]
				if done.State != want || done.NeedsReview || done.UnknownSince != nil {
					t.Fatalf("Complete(%v) from UNKNOWN = %v", outcome, done)
				}
				if h := e.lastEntry(t, id); h.FromState != unknown || h.ToState != want {
					t.Fatalf("history = %v", h)
				}
			}
		})

		t.Run("from UNKNOWN by lease expiry, latest token", func(t *testing.T) {
			id := e.id("expired")
			op := e.claim(t, id, "short.refund", 0)
			e.waitState(t, id, unknown) // the sweeper
			done := e.complete(t, id, op.FencingToken, outSucceeded, "R-late")
			if done.State != succeeded || done.Result.GetResourceId() != "R-late" {
				t.Fatalf("a late but authoritative Complete = %v", done)
			}
			res := e.reserveAs(t, id, "short.refund", 0, newHolder())
			if res.Decision != replay || res.Operation.Result.GetResourceId() != "R-late" {
				t.Fatalf("Reserve after = %v", res)
			}
		})

		t.Run("from UNKNOWN, an earlier attempt's token", func(t *testing.T) {
			id := e.id("unknown-stale")
			first := e.claim(t, id, "payments.refund", 0)
			e.complete(t, id, first.FencingToken, outRetryable, "503")
			second := e.claim(t, id, "payments.refund", 0)
			e.markUnknown(t, id, second.FencingToken)
			before := e.lookup(t, id)
			_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: first.FencingToken,
				Outcome: outSucceeded, Result: &ledgerv1.Result{ResourceId: "R-stale"}})
			if ei := wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN"); ei.Metadata["state"] != "STATE_UNKNOWN" {
				t.Fatalf("metadata %v", ei.Metadata)
			}
			e.wantUnchanged(t, id, before)
		})

		t.Run("stale token on RUNNING", func(t *testing.T) {
			id := e.id("running-stale")
			op := e.claim(t, id, "payments.refund", 0)
			before := e.lookup(t, id)
			for _, tok := range []uint64{op.FencingToken - 1, op.FencingToken + 1} {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok, Outcome: outSucceeded})
				if ei := wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN"); ei.Metadata["state"] != "STATE_RUNNING" {
					t.Fatalf("metadata %v", ei.Metadata)
				}
			}
			e.wantUnchanged(t, id, before)
		})

		for _, from := range []ledgerv1.State{running, unknown} {
			t.Run("retryable failure from "+from.String(), func(t *testing.T) {
				id := e.id("retryable-" + from.String())
				op := e.claim(t, id, "payments.refund", 0)
				if from == unknown {
					e.markUnknown(t, id, op.FencingToken)
				}
				done := e.complete(t, id, op.FencingToken, outRetryable, "503")
				if done.State != pending || done.Failure.GetCode() != "503" || done.LeaseExpiresAt != nil || done.UnknownSince != nil {
					t.Fatalf("Complete(FAILED_RETRYABLE) = %v, want PENDING", done)
				}
				if h := e.lastEntry(t, id); h.Reason != "FAILED_RETRYABLE" || h.FromState != from || h.ToState != pending {
					t.Fatalf("history = %v", h)
				}
				res := e.reserveAs(t, id, "payments.refund", 0, newHolder())
				if res.Decision != execute || res.Operation.Attempt != 2 {
					t.Fatalf("Reserve after the retryable failure = %v", res)
				}
			})
		}

		// The same token and outcome again succeeds and changes nothing;
		// another outcome, or the same kind with another result or
		// failure, is COMPLETION_CONFLICT.
		for _, tc := range []struct {
			first     ledgerv1.Outcome
			firstArg  string
			other     ledgerv1.Outcome
			otherArg  string
			wantState ledgerv1.State
		}{
			{outSucceeded, "R-1", outFailed, "declined", succeeded},
			{outSucceeded, "R-1", outRetryable, "503", succeeded},
			{outSucceeded, "R-1", outSucceeded, "R-2", succeeded},
			{outFailed, "declined", outSucceeded, "R-1", failed},
			{outFailed, "declined", outFailed, "other_code", failed},
			{outRetryable, "503", outSucceeded, "R-1", pending},
			{outRetryable, "503", outFailed, "declined", pending},
		} {
			name := tc.first.String() + " then " + tc.other.String() + " " + tc.otherArg
			t.Run(name, func(t *testing.T) {
				id := e.id(name)
				op := e.claim(t, id, "payments.refund", 0)
				e.complete(t, id, op.FencingToken, tc.first, tc.firstArg)
				before := e.lookup(t, id)
				again := e.complete(t, id, op.FencingToken, tc.first, tc.firstArg)
				if again.State != tc.wantState {
					t.Fatalf("the repeat = %v", again)
				}
				e.wantUnchanged(t, id, before)
				req := &ledgerv1.CompleteRequest{OperationId: id, FencingToken: op.FencingToken, Outcome: tc.other}
				if tc.other == outSucceeded {
					req.Result = &ledgerv1.Result{ResourceId: tc.otherArg, Data: mustStruct(t, map[string]any{"receipt": tc.otherArg})}
				} else {
					req.Failure = &ledgerv1.Failure{Code: tc.otherArg, Message: "refused by the destination"}
				}
				_, err := e.c.Complete(e.ctx, req)
				if ei := wantReason(t, err, codes.FailedPrecondition, "COMPLETION_CONFLICT"); ei.Metadata["state"] != tc.wantState.String() {
					t.Fatalf("metadata %v", ei.Metadata)
				}
				e.wantUnchanged(t, id, before)
			})
		}
	})
}

// TestMarkUnknownRules: only the current token; RUNNING becomes UNKNOWN
// with the caller's reason; a terminal state is never downgraded.
func TestMarkUnknownRules(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		t.Run("from RUNNING", func(t *testing.T) {
			id := e.id("running")
			op := e.claim(t, id, "payments.refund", 0)
			u := e.markUnknown(t, id, op.FencingToken)
			if u.State != unknown || u.UnknownSince == nil || u.LeaseExpiresAt != nil || u.Attempt != 1 {
				t.Fatalf("MarkUnknown = %v", u)
			}
			if h := e.lastEntry(t, id); h.Reason != "MARKED_UNKNOWN" || h.Detail != "timeout" || h.FromState != running || h.ToState != unknown {
				t.Fatalf("history = %v", h)
			}
		})

		t.Run("stale token", func(t *testing.T) {
			id := e.id("stale")
			first := e.claim(t, id, "payments.refund", 0)
			e.complete(t, id, first.FencingToken, outRetryable, "503")
			e.claim(t, id, "payments.refund", 0)
			before := e.lookup(t, id)
			_, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: first.FencingToken})
			if ei := wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN"); ei.Metadata["state"] != "STATE_RUNNING" {
				t.Fatalf("metadata %v", ei.Metadata)
			}
			e.wantUnchanged(t, id, before)
		})

		t.Run("stale token on a terminal record", func(t *testing.T) {
			id := e.id("stale-terminal")
			first := e.claim(t, id, "payments.refund", 0)
			e.complete(t, id, first.FencingToken, outRetryable, "503")
			e.complete(t, id, e.claim(t, id, "payments.refund", 0).FencingToken, outSucceeded, "R-2")
			before := e.lookup(t, id)
			_, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: first.FencingToken})
			if ei := wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN"); ei.Metadata["state"] != "STATE_SUCCEEDED" {
				t.Fatalf("metadata %v", ei.Metadata)
			}
			e.wantUnchanged(t, id, before)
		})

		// The attempt already reported a retryable failure: it cannot
		// also not know.
		t.Run("PENDING by this attempt's retryable failure", func(t *testing.T) {
			id := e.id("pending-own")
			op := e.claim(t, id, "payments.refund", 0)
			e.complete(t, id, op.FencingToken, outRetryable, "503")
			before := e.lookup(t, id)
			_, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: op.FencingToken})
			if ei := wantReason(t, err, codes.FailedPrecondition, "COMPLETION_CONFLICT"); ei.Metadata["state"] != "STATE_PENDING" {
				t.Fatalf("metadata %v", ei.Metadata)
			}
			e.wantUnchanged(t, id, before)
		})

		// The lease ran out, a reconciler found nothing, then the worker,
		// whose token is still the latest, says it cannot tell: its
		// request may have reached the destination after the check.
		t.Run("PENDING by a finding, then the latest attempt's report", func(t *testing.T) {
			id := e.id("pending-found")
			op := e.claim(t, id, "short.refund", 0)
			e.waitState(t, id, unknown) // the sweeper
			if _, err := e.reconcileAs(t, id, notApplied); err != nil {
				t.Fatal(err)
			}
			u := e.markUnknown(t, id, op.FencingToken)
			if u.State != unknown || u.Attempt != 1 || u.UnknownSince == nil {
				t.Fatalf("MarkUnknown = %v", u)
			}
			if h := e.lastEntry(t, id); h.Reason != "MARKED_UNKNOWN" || h.FromState != pending || h.ToState != unknown {
				t.Fatalf("history = %v", h)
			}
			if res := e.reserveAs(t, id, "short.refund", 0, newHolder()); res.Decision != reconcile {
				t.Fatalf("Reserve after = %v, want RECONCILE", res.Decision)
			}
		})

		// Terminal by the worker's own Complete, and by a reconciler's
		// finding after the lease ran out: the worker's late MarkUnknown
		// leaves the outcome as recorded.
		terminal := []struct {
			name  string
			setup func(id string) uint64
			want  ledgerv1.State
		}{
			{"SUCCEEDED by Complete", func(id string) uint64 {
				op := e.claim(t, id, "payments.refund", 0)
				e.complete(t, id, op.FencingToken, outSucceeded, "R-1")
				return op.FencingToken
			}, succeeded},
			{"FAILED_FINAL by Complete", func(id string) uint64 {
				op := e.claim(t, id, "payments.refund", 0)
				e.complete(t, id, op.FencingToken, outFailed, "declined")
				return op.FencingToken
			}, failed},
			{"SUCCEEDED by Reconcile", func(id string) uint64 {
				op := e.claim(t, id, "short.refund", 0)
				e.waitState(t, id, unknown)
				if _, err := e.reconcileAs(t, id, applied); err != nil {
					t.Fatal(err)
				}
				return op.FencingToken
			}, succeeded},
			{"FAILED_FINAL by Reconcile", func(id string) uint64 {
				op := e.claim(t, id, "short.refund", 0)
				e.waitState(t, id, unknown)
				if _, err := e.reconcileAs(t, id, abandon); err != nil {
					t.Fatal(err)
				}
				return op.FencingToken
			}, failed},
		}
		for _, tc := range terminal {
			t.Run(tc.name, func(t *testing.T) {
				id := e.id(tc.name)
				tok := tc.setup(id)
				before := e.lookup(t, id)
				u := e.markUnknown(t, id, tok)
				if u.State != tc.want {
					t.Fatalf("MarkUnknown on %v = %v", tc.want, u)
				}
				e.wantUnchanged(t, id, before)
			})
		}
	})
}

// TestRenewRules: Renew extends a live claim with the current token only.
func TestRenewRules(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		t.Run("current token", func(t *testing.T) {
			id := e.id("live")
			op := e.claim(t, id, "payments.refund", 0)
			time.Sleep(10 * time.Millisecond) // the store's clock moves on
			r, err := e.c.Renew(e.ctx, &ledgerv1.RenewRequest{OperationId: id, FencingToken: op.FencingToken})
			if err != nil {
				t.Fatal(err)
			}
			if r.Operation.State != running || !r.Operation.LeaseExpiresAt.AsTime().After(op.LeaseExpiresAt.AsTime()) ||
				r.Operation.FencingToken != op.FencingToken || r.Operation.Attempt != 1 {
				t.Fatalf("Renew = %v, want the lease moved past %v", r.Operation, op.LeaseExpiresAt.AsTime())
			}
			if got := e.lookup(t, id); !proto.Equal(got.LeaseExpiresAt, r.Operation.LeaseExpiresAt) || len(got.History) != 1 {
				t.Fatalf("record after Renew = %v", got)
			}
		})

		refused := []struct {
			name  string
			setup func(id string) uint64
			state ledgerv1.State
		}{
			{"earlier token", func(id string) uint64 {
				first := e.claim(t, id, "payments.refund", 0)
				e.complete(t, id, first.FencingToken, outRetryable, "503")
				e.claim(t, id, "payments.refund", 0)
				return first.FencingToken
			}, running},
			{"later token", func(id string) uint64 {
				return e.claim(t, id, "payments.refund", 0).FencingToken + 1
			}, running},
			{"after Complete", func(id string) uint64 {
				op := e.claim(t, id, "payments.refund", 0)
				e.complete(t, id, op.FencingToken, outSucceeded, "R-1")
				return op.FencingToken
			}, succeeded},
			{"after MarkUnknown", func(id string) uint64 {
				op := e.claim(t, id, "payments.refund", 0)
				e.markUnknown(t, id, op.FencingToken)
				return op.FencingToken
			}, unknown},
			{"after a retryable failure", func(id string) uint64 {
				op := e.claim(t, id, "payments.refund", 0)
				e.complete(t, id, op.FencingToken, outRetryable, "503")
				return op.FencingToken
			}, pending},
		}
		for _, tc := range refused {
			t.Run(tc.name, func(t *testing.T) {
				id := e.id(tc.name)
				tok := tc.setup(id)
				before := e.lookup(t, id)
				_, err := e.c.Renew(e.ctx, &ledgerv1.RenewRequest{OperationId: id, FencingToken: tok})
				if ei := wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN"); ei.Metadata["state"] != tc.state.String() {
					t.Fatalf("metadata %v, want state %v", ei.Metadata, tc.state)
				}
				e.wantUnchanged(t, id, before)
			})
		}
	})
}
