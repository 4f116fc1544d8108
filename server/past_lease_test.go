package server_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
)

// eachUnsweptBackend runs f on a redis-server and an embedded engine of its
// own, with no sweeper: the shared servers are swept by the other tests'
// ledgers, which would move an irreversible claim past its lease to UNKNOWN
// before the call under test finds it.
func eachUnsweptBackend(t *testing.T, f func(t *testing.T, e *env)) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		f(t, startEnvUnswept(t, redistest.Start(t).Client(t)))
	})
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		f(t, startEnvUnswept(t, redistest.Embedded(t)))
	})
}

// TestIrreversiblePastLease: an irreversible claim past its lease that no
// sweeper has moved is still RUNNING. Reserve makes it UNKNOWN
// (LEASE_EXPIRED) and answers RECONCILE, to the same holder too; Complete
// and MarkUnknown with its token are accepted, Renew is refused; Reconcile
// accepts every finding on it.
func TestIrreversiblePastLease(t *testing.T) {
	eachUnsweptBackend(t, func(t *testing.T, e *env) {
		t.Run("Reserve", func(t *testing.T) {
			id := e.id("reserve")
			holder := newHolder()
			first := e.reserveAs(t, id, "short.refund", 0, holder).Operation
			e.waitLeaseEnd(t, first)
			if op := e.lookup(t, id); op.State != running {
				t.Fatalf("state %v before the Reserve, want RUNNING (nothing sweeps)", op.State)
			}
			res := e.reserveAs(t, id, "short.refund", 0, holder)
			if res.Decision != reconcile || res.Operation.State != unknown || res.Operation.Reason != "LEASE_EXPIRED" ||
				res.Operation.Attempt != 1 || res.Operation.FencingToken != first.FencingToken {
				t.Fatalf("Reserve after the lease = %v, want RECONCILE, UNKNOWN (LEASE_EXPIRED)", res)
			}
			if h := e.lastEntry(t, id); h.Reason != "LEASE_EXPIRED" || h.FromState != running || h.ToState != unknown {
				t.Fatalf("history = %v", h)
			}
		})

		// The lease is not checked by Complete and MarkUnknown: the worker
		// whose token is still the current one reports what happened.
		t.Run("Complete", func(t *testing.T) {
			id := e.id("complete")
			op := e.claim(t, id, "short.refund", 0)
			e.waitLeaseEnd(t, op)
			done := e.complete(t, id, op.FencingToken, outSucceeded, "R-1")
			if done.State != succeeded || e.lastEntry(t, id).FromState != running {
				t.Fatalf("Complete past the lease = %v", done)
			}
		})
		t.Run("MarkUnknown", func(t *testing.T) {
			id := e.id("mark")
			op := e.claim(t, id, "short.refund", 0)
			e.waitLeaseEnd(t, op)
			if u := e.markUnknown(t, id, op.FencingToken); u.State != unknown || u.Reason != "MARKED_UNKNOWN" {
				t.Fatalf("MarkUnknown past the lease = %v", u)
			}
		})
		// Renew cannot bring an ended lease back (design.md, 3.4 rule 7):
		// an irreversible operation becomes UNKNOWN, as the sweeper would
		// make it; an idempotent one is left for a Reserve to reclaim.
		for _, tc := range []struct {
			tool   string
			state  ledgerv1.State
			reason string
		}{{"short.refund", unknown, "LEASE_EXPIRED"}, {"short.idempotent", running, "RESERVED"}} {
			t.Run("Renew "+tc.tool, func(t *testing.T) {
				id := e.id("renew-" + tc.tool)
				op := e.claim(t, id, tc.tool, 0)
				e.waitLeaseEnd(t, op)
				_, err := e.c.Renew(e.ctx, &ledgerv1.RenewRequest{OperationId: id, FencingToken: op.FencingToken})
				if ei := wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN"); ei.Metadata["state"] != tc.state.String() {
					t.Fatalf("metadata %v, want state %v", ei.Metadata, tc.state)
				}
				got := e.lookup(t, id)
				if got.State != tc.state || got.Reason != tc.reason {
					t.Fatalf("after Renew past the lease: %v", got)
				}
				if tc.state == running && !proto.Equal(got.LeaseExpiresAt, op.LeaseExpiresAt) {
					t.Fatalf("Renew past the lease moved it to %v", got.LeaseExpiresAt.AsTime())
				}
			})
		}

		for _, f := range []ledgerv1.Finding{applied, notApplied, abandon, escalate} {
			t.Run("Reconcile "+f.String(), func(t *testing.T) {
				id := e.id(f.String())
				e.waitLeaseEnd(t, e.claim(t, id, "short.refund", 0))
				if op := e.lookup(t, id); op.State != running {
					t.Fatalf("state %v before the finding, want RUNNING (nothing sweeps)", op.State)
				}
				op, err := e.reconcileAs(t, id, f)
				if err != nil {
					t.Fatalf("Reconcile(%v) of a RUNNING operation past its lease: %v", f, err)
				}
				want := map[ledgerv1.Finding]ledgerv1.State{applied: succeeded, notApplied: pending, abandon: failed, escalate: unknown}[f]
				if h := op.History[len(op.History)-1]; op.State != want || h.FromState != running || h.ToState != want || op.LeaseExpiresAt != nil {
					t.Fatalf("Reconcile(%v) = %v, want %v from RUNNING", f, op, want)
				}
				if f == escalate && !op.NeedsReview {
					t.Fatalf("ESCALATE without the review flag: %v", op)
				}
			})
		}
	})
}

// everyRPC calls each RPC of the service about id, with token where one is
