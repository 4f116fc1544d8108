package server_test

// The state machine of contract.md §4, row by row and rule by rule, through the
// gRPC API against a real redis-server, a cluster and the embedded engine.
// The scenarios of §9 (conformance_test.go) cover the paths an agent takes;
// these tests, and those of the *_rules_test.go files, pin each rule on its
// own: the decision or error, the record after the call, and its history.

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

const (
	execute   = ledgerv1.Decision_DECISION_EXECUTE
	replay    = ledgerv1.Decision_DECISION_REPLAY
	inProg    = ledgerv1.Decision_DECISION_IN_PROGRESS
	reconcile = ledgerv1.Decision_DECISION_RECONCILE

	pending   = ledgerv1.State_STATE_PENDING
	running   = ledgerv1.State_STATE_RUNNING
	succeeded = ledgerv1.State_STATE_SUCCEEDED
	failed    = ledgerv1.State_STATE_FAILED_FINAL
	unknown   = ledgerv1.State_STATE_UNKNOWN

	irreversible = ledgerv1.Effect_EFFECT_IRREVERSIBLE
	idempotent   = ledgerv1.Effect_EFFECT_IDEMPOTENT
	readOnly     = ledgerv1.Effect_EFFECT_READ_ONLY

	outSucceeded = ledgerv1.Outcome_OUTCOME_SUCCEEDED
	outFailed    = ledgerv1.Outcome_OUTCOME_FAILED_FINAL
	outRetryable = ledgerv1.Outcome_OUTCOME_FAILED_RETRYABLE
)

// reserveAs reserves id for tool with effect (the policy's when
// unspecified) and fixed parameters, and fails the test on an error.
func (e *env) reserveAs(t *testing.T, id, tool string, effect ledgerv1.Effect, holder string) *ledgerv1.ReserveResponse {
	t.Helper()
	req := reserveReq(id, tool, mustStruct(t, map[string]any{"amount": 42}), holder)
	req.Effect = effect
	res, err := e.c.Reserve(e.ctx, req)
	if err != nil {
		t.Fatalf("Reserve(%s): %v", id, err)
	}
	return res
}

// claim reserves a new operation and checks it is EXECUTE.
func (e *env) claim(t *testing.T, id, tool string, effect ledgerv1.Effect) *ledgerv1.Operation {
	t.Helper()
	res := e.reserveAs(t, id, tool, effect, newHolder())
	if res.Decision != execute {
		t.Fatalf("Reserve(%s) = %v, want EXECUTE", id, res.Decision)
	}
	return res.Operation
}

func (e *env) complete(t *testing.T, id string, token uint64, outcome ledgerv1.Outcome, rid string) *ledgerv1.Operation {
	t.Helper()
	req := &ledgerv1.CompleteRequest{OperationId: id, FencingToken: token, Outcome: outcome}
	if outcome == outSucceeded {
		req.Result = &ledgerv1.Result{ResourceId: rid, Data: mustStruct(t, map[string]any{"receipt": rid})}
	} else {
		req.Failure = &ledgerv1.Failure{Code: rid, Message: "refused by the destination"}
	}
	res, err := e.c.Complete(e.ctx, req)
	if err != nil {
		t.Fatalf("Complete(%s, %v): %v", id, outcome, err)
	}
	return res.Operation
}

func (e *env) markUnknown(t *testing.T, id string, token uint64) *ledgerv1.Operation {
	t.Helper()
	res, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: token, Reason: "timeout"})
	if err != nil {
		t.Fatalf("MarkUnknown(%s): %v", id, err)
	}
	return res.Operation
}

// waitLeaseEnd waits until the store's clock is past the lease of op.
func (e *env) waitLeaseEnd(t *testing.T, op *ledgerv1.Operation) {
	t.Helper()
	end := op.GetLeaseExpiresAt().AsTime()
	for {
		now, err := e.rdb.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.After(end) {
			return
		}
		time.Sleep(end.Sub(now) + 5*time.Millisecond)
	}
}

// waitState waits until Lookup shows id in state st.

// lastEntry returns the latest history entry of id, by Lookup.
func (e *env) lastEntry(t *testing.T, id string) *ledgerv1.HistoryEntry {
	t.Helper()
	h := e.lookup(t, id).History
	return h[len(h)-1]
}

// wantUnchanged fails unless id's record is as before.
func (e *env) wantUnchanged(t *testing.T, id string, before *ledgerv1.Operation) {
	t.Helper()
	if after := e.lookup(t, id); !proto.Equal(before, after) {
		t.Fatalf("the record changed:\nbefore %v\nafter  %v", before, after)
	}
}

// TestReserveTable: every row of contract.md §4's Reserve table, with the decision,
// the record it leaves and the history entry it writes.
func TestReserveTable(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		t.Run("none", func(t *testing.T) {
			id := e.id("none")
			holder := newHolder()
			res := e.reserveAs(t, id, "payments.refund", 0, holder)
			op := res.Operation
			if res.Decision != execute || op.State != running || op.Attempt != 1 || op.FencingToken == 0 || res.Holder != holder ||
				op.LeaseExpiresAt == nil || op.Effect != irreversible {
				t.Fatalf("Reserve of a new id = %v", res)
			}
			if h := e.lastEntry(t, id); h.Reason != "RESERVED" || h.FromState != ledgerv1.State_STATE_UNSPECIFIED || h.ToState != running {
				t.Fatalf("history = %v", h)
			}
		})

		t.Run("PENDING", func(t *testing.T) {
			id := e.id("pending")
			first := e.claim(t, id, "payments.refund", 0)
			e.complete(t, id, first.FencingToken, outRetryable, "503")
			res := e.reserveAs(t, id, "payments.refund", 0, newHolder())
			if res.Decision != execute || res.Operation.State != running || res.Operation.Attempt != 2 ||
				res.Operation.FencingToken <= first.FencingToken {
				t.Fatalf("Reserve of a PENDING operation = %v", res)
			}
			if h := e.lastEntry(t, id); h.Reason != "CLAIMED" || h.FromState != pending || h.ToState != running || h.Attempt != 2 {
				t.Fatalf("history = %v", h)
			}
		})

		t.Run("PENDING, attempts exhausted", func(t *testing.T) {
			id := e.id("exhausted")
			for attempt := range 3 {
				op := e.claim(t, id, "payments.refund", 0)
				if op.Attempt != uint32(attempt+1) {
					t.Fatalf("attempt %d, want %d", op.Attempt, attempt+1)
				}
				e.complete(t, id, op.FencingToken, outRetryable, "503")
			}
			res := e.reserveAs(t, id, "payments.refund", 0, newHolder())
			if res.Decision != replay || res.Operation.State != failed || res.Operation.Reason != "RETRIES_EXHAUSTED" ||
				res.Operation.Failure.GetCode() != "RETRIES_EXHAUSTED" || res.Operation.Attempt != 3 {
				t.Fatalf("Reserve with no attempts left = %v", res)
			}
			if h := e.lastEntry(t, id); h.Reason != "RETRIES_EXHAUSTED" || h.FromState != pending || h.ToState != failed || h.Attempt != 3 {
				t.Fatalf("history = %v", h)
			}
			before := e.lookup(t, id)
			if again := e.reserveAs(t, id, "payments.refund", 0, newHolder()); again.Decision != replay || again.Operation.State != failed {
				t.Fatalf("Reserve again = %v, want REPLAY of the failure", again)
			}
			e.wantUnchanged(t, id, before)
		})

		t.Run("RUNNING, lease valid, same holder", func(t *testing.T) {
			id := e.id("same-holder")
			holder := newHolder()
			first := e.reserveAs(t, id, "payments.refund", 0, holder)
			before := e.lookup(t, id)
			again := e.reserveAs(t, id, "payments.refund", 0, holder)
			if again.Decision != execute || again.Operation.Attempt != 1 || again.Operation.FencingToken != first.Operation.FencingToken {
				t.Fatalf("Reserve by the same holder = %v, want EXECUTE with attempt 1, token %d", again, first.Operation.FencingToken)
			}
			e.wantUnchanged(t, id, before)
		})

		t.Run("RUNNING, lease valid, other holder", func(t *testing.T) {
			id := e.id("other-holder")
			e.claim(t, id, "payments.refund", 0)
			before := e.lookup(t, id)
			res := e.reserveAs(t, id, "payments.refund", 0, newHolder())
			if res.Decision != inProg || res.RetryAfter == nil || res.RetryAfter.AsDuration() <= 0 {
				t.Fatalf("Reserve by another holder = %v, want IN_PROGRESS with retry_after", res)
			}
			e.wantUnchanged(t, id, before)
		})

		for _, tc := range []struct {
			name   string
			effect ledgerv1.Effect
		}{{"idempotent", idempotent}, {"read-only", readOnly}} {
			t.Run("RUNNING, lease expired, "+tc.name, func(t *testing.T) {
				id := e.id("reclaim-" + tc.name)
				holder := newHolder()
				first := e.reserveAs(t, id, "short.refund", tc.effect, holder).Operation
				e.waitLeaseEnd(t, first)
				// The same holder too: after the lease it is anyone.
				res := e.reserveAs(t, id, "short.refund", tc.effect, holder)
				if res.Decision != execute || res.Operation.Attempt != 2 || res.Operation.FencingToken <= first.FencingToken {
					t.Fatalf("Reserve after the lease = %v, want EXECUTE attempt 2 with a new token", res)
				}
				if h := e.lastEntry(t, id); h.Reason != "RECLAIMED" || h.FromState != running || h.ToState != running {
					t.Fatalf("history = %v", h)
				}
			})
		}

		for _, tc := range []struct {
			name   string
			effect ledgerv1.Effect
			want   ledgerv1.Decision
		}{{"idempotent", idempotent, execute}, {"read-only", readOnly, execute}, {"irreversible", irreversible, reconcile}} {
			t.Run("UNKNOWN, "+tc.name, func(t *testing.T) {
				id := e.id("unknown-" + tc.name)
				holder := newHolder()
				first := e.reserveAs(t, id, "payments.refund", tc.effect, holder).Operation
				e.markUnknown(t, id, first.FencingToken)
				before := e.lookup(t, id)
				res := e.reserveAs(t, id, "payments.refund", tc.effect, holder)
				if res.Decision != tc.want {
					t.Fatalf("Reserve of an UNKNOWN %s operation = %v, want %v", tc.name, res.Decision, tc.want)
				}
				if tc.want == reconcile {
					e.wantUnchanged(t, id, before)
					return
				}
				if res.Operation.State != running || res.Operation.Attempt != 2 || res.Operation.FencingToken <= first.FencingToken {
					t.Fatalf("reclaim = %v", res.Operation)
				}
				if h := e.lastEntry(t, id); h.Reason != "RECLAIMED" || h.FromState != unknown || h.ToState != running {
					t.Fatalf("history = %v", h)
				}
			})
		}

		// Out of attempts, an idempotent operation whose outcome is unknown
		// is not reclaimed, nor failed for good: it may have applied the
		// effect (design.md, 3.4 rule 6).
		t.Run("UNKNOWN, idempotent, attempts exhausted", func(t *testing.T) {
			id := e.id("unknown-exhausted")
			for attempt := range 3 {
				op := e.reserveAs(t, id, "payments.refund", idempotent, newHolder())
				if op.Decision != execute || op.Operation.Attempt != uint32(attempt+1) {
					t.Fatalf("Reserve = %v, want EXECUTE attempt %d", op, attempt+1)
				}
				e.markUnknown(t, id, op.Operation.FencingToken)
			}
			before := e.lookup(t, id)
			res := e.reserveAs(t, id, "payments.refund", idempotent, newHolder())
			if res.Decision != reconcile || res.Operation.State != unknown || res.Operation.Attempt != 3 {
				t.Fatalf("Reserve with no attempts left = %v, want RECONCILE", res)
			}
			e.wantUnchanged(t, id, before)
		})

		t.Run("RUNNING, lease expired, idempotent, attempts exhausted", func(t *testing.T) {
			id := e.id("running-exhausted")
			var op *ledgerv1.Operation
			for attempt := range 3 {
				res := e.reserveAs(t, id, "short.idempotent", 0, newHolder())
				if res.Decision != execute || res.Operation.Attempt != uint32(attempt+1) {
					t.Fatalf("Reserve = %v, want EXECUTE attempt %d", res, attempt+1)
				}
				op = res.Operation
				e.waitLeaseEnd(t, op)
			}
			res := e.reserveAs(t, id, "short.idempotent", 0, newHolder())
			if res.Decision != reconcile || res.Operation.State != unknown || res.Operation.Reason != "RETRIES_EXHAUSTED" ||
				res.Operation.FencingToken != op.FencingToken {
				t.Fatalf("Reserve with no attempts left = %v, want RECONCILE, UNKNOWN (RETRIES_EXHAUSTED)", res)
			}
			if h := e.lastEntry(t, id); h.FromState != running || h.ToState != unknown || h.Attempt != 3 {
				t.Fatalf("history = %v", h)
			}
		})

		t.Run("SUCCEEDED", func(t *testing.T) {
			id := e.id("succeeded")
			op := e.claim(t, id, "payments.refund", 0)
			e.complete(t, id, op.FencingToken, outSucceeded, "R-7")
			before := e.lookup(t, id)
			res := e.reserveAs(t, id, "payments.refund", 0, newHolder())
			if res.Decision != replay || res.Operation.State != succeeded || res.Operation.Result.GetResourceId() != "R-7" ||
				res.Operation.Result.GetData().GetFields()["receipt"].GetStringValue() != "R-7" {
				t.Fatalf("Reserve of a SUCCEEDED operation = %v, want REPLAY of R-7", res)
			}
			e.wantUnchanged(t, id, before)
		})

		t.Run("FAILED_FINAL", func(t *testing.T) {
			id := e.id("failed")
			op := e.claim(t, id, "payments.refund", 0)
			e.complete(t, id, op.FencingToken, outFailed, "card_declined")
			before := e.lookup(t, id)
			res := e.reserveAs(t, id, "payments.refund", 0, newHolder())
			if res.Decision != replay || res.Operation.State != failed || res.Operation.Failure.GetCode() != "card_declined" ||
				res.Operation.Failure.GetMessage() != "refused by the destination" {
				t.Fatalf("Reserve of a FAILED_FINAL operation = %v, want REPLAY of the failure", res)
			}
			e.wantUnchanged(t, id, before)
		})
	})
}

// TestKeyReusedNamesWhatDiffers: IDEMPOTENCY_KEY_REUSED names every one of
// tool, params and permit that differs, in that order, never a value, in any
// state of the record, and leaves the record as it was.
func TestKeyReusedNamesWhatDiffers(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		const tool, permit = "payments.refund", "permit-1"
		bound := map[string]any{"amount": 42}
		states := map[string]func(id string){
			"RUNNING": func(id string) { e.claim(t, id, tool, 0) },
			"PENDING": func(id string) {
				e.complete(t, id, e.claim(t, id, tool, 0).FencingToken, outRetryable, "503")
			},
			"UNKNOWN": func(id string) { e.markUnknown(t, id, e.claim(t, id, tool, 0).FencingToken) },
			"SUCCEEDED": func(id string) {
				e.complete(t, id, e.claim(t, id, tool, 0).FencingToken, outSucceeded, "R-1")
			},
			"FAILED_FINAL": func(id string) {
				e.complete(t, id, e.claim(t, id, tool, 0).FencingToken, outFailed, "declined")
			},
		}
		for name, setup := range states {
			id := e.id(name)
			setup(id)
			before := e.lookup(t, id)
			for _, tc := range []struct {
				tool, permit string
				params       map[string]any
				differs      string
			}{
				{"payments.payout", permit, bound, "tool"},
				{tool, permit, map[string]any{"amount": 4242}, "params"},
				{tool, "permit-secret-2", bound, "permit"},
				{"payments.payout", permit, map[string]any{"amount": 4242}, "tool,params"},
				{"payments.payout", "permit-secret-2", bound, "tool,permit"},
				{tool, "permit-secret-2", map[string]any{"amount": 4242}, "params,permit"},
				{"payments.payout", "permit-secret-2", map[string]any{"amount": 4242}, "tool,params,permit"},
			} {
				req := reserveReq(id, tc.tool, mustStruct(t, tc.params), newHolder())
				req.PermitId = tc.permit
				_, err := e.c.Reserve(e.ctx, req)
				ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
				if ei.Metadata["differs"] != tc.differs {
					t.Errorf("%s: differs = %q, want %q", name, ei.Metadata["differs"], tc.differs)
				}
				text := status.Convert(err).Message()
				for _, v := range ei.Metadata {
					text += " " + v
				}
				for _, value := range []string{"payout", "4242", "secret", "permit-1"} {
					if strings.Contains(text, value) {
						t.Errorf("%s: the error names the value %q: %s", name, value, text)
					}
				}
			}
			e.wantUnchanged(t, id, before)
		}
	})
}
