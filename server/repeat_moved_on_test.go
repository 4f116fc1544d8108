package server_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// TestS12RepeatAfterTheRecordMovedOn: a worker's Complete or MarkUnknown
// whose answer was lost is sent again after the operation moved on to the
// next attempt. It took effect, so the repeat answers OK and changes nothing:
// the next attempt's claim, and the effect it applies, stand alone.
func TestS12RepeatAfterTheRecordMovedOn(t *testing.T) {
	eachBackend(t, func(t *testing.T, base *env) {
		dr := &dropper{armed: map[string]bool{}}
		e := startEnv(t, base.rdb, grpc.WithChainUnaryInterceptor(dr.intercept))

		// lost sends call once with its answer lost, and returns call, to be
		// sent again later.
		lost := func(method string, call func() error) func() error {
			t.Helper()
			dr.arm(method)
			if err := call(); status.Code(err) != codes.Unavailable {
				t.Fatalf("%s = %v, want the lost response", method, err)
			}
			return call
		}

		for _, tc := range []struct {
			name   string
			fault  fault
			report func(id string, token uint64) func() error
		}{
			{"Complete(FAILED_RETRYABLE)", failBeforeWrite, func(id string, token uint64) func() error {
				return lost("Complete", func() error {
					_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: token,
						Outcome: outRetryable, Failure: &ledgerv1.Failure{Code: "503"}})
					return err
				})
			}},
			{"MarkUnknown", timeoutNoWrite, func(id string, token uint64) func() error {
				call := lost("MarkUnknown", func() error {
					_, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: token, Reason: "timeout"})
					return err
				})
				// A reconciler finds nothing at the destination.
				if _, err := e.reconcileAs(t, id, notApplied); err != nil {
					t.Fatal(err)
				}
				return call
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				d := newDestination(tc.fault)
				id := e.id(tc.name)
				first := e.claim(t, id, "payments.refund", 0)
				if _, err := d.apply(id, "42"); err == nil {
					t.Fatal("the destination accepted the first request")
				}
				again := tc.report(id, first.FencingToken)
				if st := e.lookup(t, id).State; st != pending {
					t.Fatalf("state %v after attempt 1's report, want PENDING", st)
				}

				// Attempt 2 claims the operation.
				second := e.claim(t, id, "payments.refund", 0)
				if second.Attempt != 2 {
					t.Fatalf("attempt %d, want 2", second.Attempt)
				}
				before := e.lookup(t, id)
				// Attempt 1's report arrives again.
				if err := again(); err != nil {
					t.Fatalf("the repeat of attempt 1's report: %v, want OK (it took effect)", err)
				}
				e.wantUnchanged(t, id, before)

				// Attempt 2 applies the effect and records it; every later
				// call replays it.
				rid, err := d.apply(id, "42")
				if err != nil {
					t.Fatal(err)
				}
				e.complete(t, id, second.FencingToken, outSucceeded, rid)
				if err := again(); err != nil {
					t.Fatalf("the repeat after attempt 2 succeeded: %v", err)
				}
				if got, err := e.perform(t, d, id, "payments.refund", map[string]any{"amount": 42}); err != nil || got != rid {
					t.Fatalf("retry = %q, %v; want the replayed %q", got, err, rid)
				}
				if op := e.lookup(t, id); op.State != succeeded || op.Result.GetResourceId() != rid {
					t.Fatalf("record = %v", op)
				}
				if n := d.count(id); n != 1 {
					t.Fatalf("the destination applied the effect %d times, want 1", n)
				}
			})
		}
	})
}
