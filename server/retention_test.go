package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// TestRetentionOverTheWire: contract.md §6: a terminal record lives for
// max(policy retention, retain_until + grace), as its expires_at says, then
// leaves a tombstone; a record that is not terminal (PENDING, RUNNING,
// UNKNOWN) has no expires_at and outlives the retention of its tool.
func TestRetentionOverTheWire(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		storeNow, err := e.rdb.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		// reserve reserves id with retain_until (none when zero).
		reserve := func(id, tool string, until time.Time) *ledgerv1.Operation {
			t.Helper()
			req := reserveReq(id, tool, mustStruct(t, map[string]any{"amount": 42}), newHolder())
			if !until.IsZero() {
				req.RetainUntil = timestamppb.New(until)
			}
			res, err := e.c.Reserve(e.ctx, req)
			if err != nil || res.Decision != execute {
				t.Fatalf("Reserve(%s) = %v, %v", id, res, err)
			}
			if !until.IsZero() && !res.Operation.RetainUntil.AsTime().Equal(until) {
				t.Fatalf("retain_until %v, want %v", res.Operation.RetainUntil.AsTime(), until)
			}
			if res.Operation.ExpiresAt != nil {
				t.Fatalf("a RUNNING record with expires_at %v", res.Operation.ExpiresAt.AsTime())
			}
			return res.Operation
		}
		hour := storeNow.Add(time.Hour).Truncate(time.Millisecond)
		month := storeNow.Add(30 * 24 * time.Hour).Truncate(time.Millisecond)
		for _, tc := range []struct {
			name, tool string
			until      time.Time
			// want returns the expires_at the record must show, from the
			// time it ended.
			want func(ended time.Time) time.Time
		}{
			// tiny.*: retention 1 s, no grace.
			{"tiny", "tiny.refund", time.Time{}, func(ended time.Time) time.Time { return ended.Add(time.Second) }},
			{"tiny until in an hour", "tiny.refund", hour, func(time.Time) time.Time { return hour }},
			// The defaults: retention 7 days, grace 1 day.
			{"default until in an hour", "payments.refund", hour, func(ended time.Time) time.Time { return ended.Add(7 * 24 * time.Hour) }},
			{"default until in a month", "payments.refund", month, func(time.Time) time.Time { return month.Add(24 * time.Hour) }},
		} {
			id := e.id(tc.name)
			op := reserve(id, tc.tool, tc.until)
			done := e.complete(t, id, op.FencingToken, outSucceeded, "R-1")
			if want := tc.want(done.UpdatedAt.AsTime()); !done.ExpiresAt.AsTime().Equal(want) {
				t.Errorf("%s: expires_at %v, want %v", tc.name, done.ExpiresAt.AsTime(), want)
			}
			if got := e.lookup(t, id); !got.ExpiresAt.AsTime().Equal(done.ExpiresAt.AsTime()) {
				t.Errorf("%s: Lookup's expires_at %v, Complete's %v", tc.name, got.ExpiresAt.AsTime(), done.ExpiresAt.AsTime())
			}
		}

		// Records of tiny.* that are not terminal.
		nonTerminal := map[string]ledgerv1.State{e.id("running"): running, e.id("pending"): pending, e.id("unknown"): unknown}
		for id, st := range nonTerminal {
			op := reserve(id, "tiny.refund", time.Time{})
			switch st {
			case pending:
				e.complete(t, id, op.FencingToken, outRetryable, "503")
			case unknown:
				e.markUnknown(t, id, op.FencingToken)
			}
			if got := e.lookup(t, id); got.State != st || got.ExpiresAt != nil {
				t.Fatalf("%s: %v with expires_at %v", id, got.State, got.ExpiresAt)
			}
		}

		// Once the plain tiny record has expired (1 s), only its tombstone
		// is left ...
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: e.id("tiny")})
			if err != nil {
				wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_EXPIRED")
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the tiny record never expired")
			}
			time.Sleep(100 * time.Millisecond)
		}
		// ... while the one held by its retain_until still replays, and
		// the records that are not terminal are all there, as they were.
		if res := e.reserveAs(t, e.id("tiny until in an hour"), "tiny.refund", 0, newHolder()); res.Decision != replay || res.Operation.Result.GetResourceId() != "R-1" {
			t.Fatalf("Reserve of the record held by retain_until = %v, want REPLAY", res)
		}
		for id, st := range nonTerminal {
			if got := e.lookup(t, id); got.State != st {
				t.Fatalf("%s: %v after the tool's retention, want %v", id, got.State, st)
			}
		}
	})
}
