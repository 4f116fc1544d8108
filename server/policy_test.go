package server_test

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestPoliciesOverTheWire: contract.md §6: the policy of an operation comes from
// the config file, per tenant and per tool pattern (the first matching rule,
// over the defaults), and shows in the snapshot: the effect when the request
// leaves it unspecified, the lease, max_attempts, and the recovery window
// (recovery_deadline is unknown_since plus it).
func TestPoliciesOverTheWire(t *testing.T) {
	pol, err := ledger.ParsePolicies([]byte(`
defaults:
  max_attempts: 4
  recovery_window: 20m
tools:
  - match: "crm.*"
    tenant: "vip-*"
    effect: idempotent
    lease: 90s
    max_attempts: 7
  - match: "crm.*"
    lease: 45s
  - match: "search.*"
    effect: read_only
`))
	if err != nil {
		t.Fatal(err)
	}
	kr := newKeyring(t)
	suffix := randomHex(4)
	vip := as(kr.add(t, "vip", "vip-"+suffix, "agent", false))
	plain := as(kr.add(t, "plain", "plain-"+suffix, "agent", false))
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{}, ledger.Options{Policies: pol}, nil)

	for _, tc := range []struct {
		name        string
		caller      string
		tool        string
		effect      ledgerv1.Effect // in the request
		wantEffect  ledgerv1.Effect
		wantLease   time.Duration
		wantMax     uint32
		wantRecover time.Duration
	}{
		{"the tenant's rule", "vip", "crm.sync", 0, idempotent, 90 * time.Second, 7, 20 * time.Minute},
		{"the tool's rule for any tenant", "plain", "crm.sync", 0, irreversible, 45 * time.Second, 4, 20 * time.Minute},
		{"another tool's rule", "plain", "search.query", 0, readOnly, 30 * time.Second, 4, 20 * time.Minute},
		{"the request's effect wins", "plain", "crm.sync", idempotent, idempotent, 45 * time.Second, 4, 20 * time.Minute},
		{"no rule", "vip", "payments.refund", 0, irreversible, 30 * time.Second, 4, 20 * time.Minute},
	} {
		caller := vip
		if tc.caller == "plain" {
			caller = plain
		}
		id := "policy-" + suffix + ":" + tc.name
		req := reserveReq(id, tc.tool, nil, newHolder())
		req.Effect = tc.effect
		res, err := e.c.Reserve(caller, req)
		if err != nil || res.Decision != execute {
			t.Fatalf("%s: Reserve = %v, %v", tc.name, res, err)
		}
		op := res.Operation
		if lease := op.LeaseExpiresAt.AsTime().Sub(op.CreatedAt.AsTime()); op.Effect != tc.wantEffect || lease != tc.wantLease || op.MaxAttempts != tc.wantMax {
			t.Errorf("%s: effect %v, lease %v, max_attempts %d; want %v, %v, %d", tc.name, op.Effect, lease, op.MaxAttempts, tc.wantEffect, tc.wantLease, tc.wantMax)
		}
		u, err := e.c.MarkUnknown(caller, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: op.FencingToken})
		if err != nil {
			t.Fatal(err)
		}
		if w := u.Operation.RecoveryDeadline.AsTime().Sub(u.Operation.UnknownSince.AsTime()); w != tc.wantRecover {
			t.Errorf("%s: recovery_deadline is unknown_since + %v, want + %v", tc.name, w, tc.wantRecover)
		}
	}
}

// TestConsequentialFieldsOverTheWire: contract.md §6: with a policy naming the
// consequential fields (picky.*), only they are fingerprinted: a retry that
// changes another parameter replays, one that changes a named field is
// IDEMPOTENCY_KEY_REUSED. The fingerprints are those of the worked example
// of docs/configuration.md, section 6.5, with the fields and without, and a
// precomputed params_sha256 of the selection is the same request.
func TestConsequentialFieldsOverTheWire(t *testing.T) {
	const (
		withFields    = "9525913bec02bb3e488cc124c29b093efae216d35853c767da99e6fdc8db3aa0"
		withoutFields = "b993b65b9ecc00edc4f7789a0a317ccfd0bc5d5143e6ae570a3736d56ba32ea2"
	)
	params := map[string]any{"currency": "EUR", "amount": 12.5, "charge_id": "ch_1", "memo": "thanks"}
	eachBackend(t, func(t *testing.T, e *env) {
		for _, tc := range []struct{ tool, want string }{{"picky.refund", withFields}, {"payments.refund", withoutFields}} {
			id := e.id(tc.tool + "-example")
			res, err := e.c.Reserve(e.ctx, reserveReq(id, tc.tool, mustStruct(t, params), newHolder()))
			if err != nil || res.Decision != execute {
				t.Fatalf("Reserve(%s) = %v, %v", tc.tool, res, err)
			}
			if got := hex.EncodeToString(res.Operation.ParamsSha256); got != tc.want {
				t.Errorf("%s: params_sha256 %s, want %s", tc.tool, got, tc.want)
			}
			e.complete(t, id, res.Operation.FencingToken, outSucceeded, "R-1")
		}

		id := e.id("picky.refund-example")
		before := e.lookup(t, id)
		retry := func(p map[string]any) (*ledgerv1.ReserveResponse, error) {
			return e.c.Reserve(e.ctx, reserveReq(id, "picky.refund", mustStruct(t, p), newHolder()))
		}
		// Another memo, and a parameter more: not consequential.
		res, err := retry(map[string]any{"currency": "EUR", "amount": 12.5, "charge_id": "ch_1", "memo": "many thanks", "locale": "de"})
		if err != nil || res.Decision != replay || res.Operation.Result.GetResourceId() != "R-1" {
			t.Fatalf("retry with another memo = %v, %v; want REPLAY", res, err)
		}
		// The precomputed fingerprint of the selection.
		sum, _ := hex.DecodeString(withFields)
		req := reserveReq(id, "picky.refund", nil, newHolder())
		req.ParamsSha256 = sum
		if res, err := e.c.Reserve(e.ctx, req); err != nil || res.Decision != replay {
			t.Fatalf("retry with params_sha256 = %v, %v; want REPLAY", res, err)
		}
		// A named field changed, or left out.
		for _, p := range []map[string]any{
			{"currency": "EUR", "amount": 125, "charge_id": "ch_1", "memo": "thanks"},
			{"currency": "EUR", "amount": 12.5, "memo": "thanks"},
		} {
			_, err := retry(p)
			if ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED"); ei.Metadata["differs"] != "params" {
				t.Fatalf("differs = %q", ei.Metadata["differs"])
			}
		}
		e.wantUnchanged(t, id, before)

		// Without named fields, the memo counts.
		_, err = e.c.Reserve(e.ctx, reserveReq(e.id("payments.refund-example"), "payments.refund",
			mustStruct(t, map[string]any{"currency": "EUR", "amount": 12.5, "charge_id": "ch_1", "memo": "many thanks"}), newHolder()))
		wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
	})
}

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
			// compact.*: retention 1 s, no grace.
			{"tiny", "compact.refund", time.Time{}, func(ended time.Time) time.Time { return ended.Add(time.Second) }},
			{"tiny until in an hour", "compact.refund", hour, func(time.Time) time.Time { return hour }},
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

		// Records of compact.* that are not terminal.
		nonTerminal := map[string]ledgerv1.State{e.id("running"): running, e.id("pending"): pending, e.id("unknown"): unknown}
		for id, st := range nonTerminal {
			op := reserve(id, "compact.refund", time.Time{})
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
		if res := e.reserveAs(t, e.id("tiny until in an hour"), "compact.refund", 0, newHolder()); res.Decision != replay || res.Operation.Result.GetResourceId() != "R-1" {
			t.Fatalf("Reserve of the record held by retain_until = %v, want REPLAY", res)
		}
		for id, st := range nonTerminal {
			if got := e.lookup(t, id); got.State != st {
				t.Fatalf("%s: %v after the tool's retention, want %v", id, got.State, st)
			}
		}
	})
}

// TestOneClockTheStores: contract.md §6: lease and retention times come from the
// store's clock, shared by every ledger instance, never from an instance's
// own. The store's clock here is frozen 1000 hours behind the instances':
// by theirs every lease ended long ago, by the store's none has until the
// store's clock is moved on past it.
func TestOneClockTheStores(t *testing.T) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	storeNow := time.Now().Add(-1000 * time.Hour).Truncate(time.Millisecond)
	m.SetTime(storeNow)
	client := func() redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	a, b := startEnv(t, client()), startEnv(t, client()) // two instances, each with its sweeper
	const lease = 200 * time.Millisecond                 // expiring.* in ledgertest.Policy

	idem, irrev := a.id("sync"), a.id("refund")
	first := a.reserveAs(t, idem, "expiring.idempotent", 0, newHolder()).Operation
	a.reserveAs(t, irrev, "expiring.refund", 0, newHolder())
	if !first.CreatedAt.AsTime().Equal(storeNow) || !first.LeaseExpiresAt.AsTime().Equal(storeNow.Add(lease)) {
		t.Fatalf("created_at %v, lease_expires_at %v; want the store's %v and %v",
			first.CreatedAt.AsTime(), first.LeaseExpiresAt.AsTime(), storeNow, storeNow.Add(lease))
	}

	// The other instance, asked by another holder, finds the lease live.
	res := b.reserveAs(t, idem, "expiring.idempotent", 0, newHolder())
	if res.Decision != inProg || res.RetryAfter.AsDuration() <= 0 || res.RetryAfter.AsDuration() > lease {
		t.Fatalf("Reserve by another holder through the other instance = %v, want IN_PROGRESS within the lease", res)
	}
	time.Sleep(3 * lease) // the instances' clocks move on; the store's does not
	if op := b.lookup(t, irrev); op.State != running {
		t.Fatalf("the irreversible claim is %v before the store's clock passed its lease, want RUNNING", op.State)
	}
	if res := b.reserveAs(t, idem, "expiring.idempotent", 0, newHolder()); res.Decision != inProg {
		t.Fatalf("Reserve before the store's clock passed the lease = %v, want IN_PROGRESS", res.Decision)
	}
	if r, err := b.c.Renew(b.ctx, &ledgerv1.RenewRequest{OperationId: idem, FencingToken: first.FencingToken}); err != nil ||
		!r.Operation.LeaseExpiresAt.AsTime().Equal(storeNow.Add(lease)) {
		t.Fatalf("Renew = %v, %v; want the lease to end at the store's %v", r, err, storeNow.Add(lease))
	}

	// The store's clock passes the lease: the idempotent claim is taken
	// over, the irreversible one is swept to UNKNOWN by the store's time.
	later := storeNow.Add(lease + time.Millisecond)
	m.SetTime(later)
	res = b.reserveAs(t, idem, "expiring.idempotent", 0, newHolder())
	if res.Decision != execute || res.Operation.Attempt != 2 || !res.Operation.UpdatedAt.AsTime().Equal(later) {
		t.Fatalf("Reserve after the store's clock passed the lease = %v, want EXECUTE attempt 2 at %v", res, later)
	}
	op := b.waitState(t, irrev, unknown)
	if h := op.History[len(op.History)-1]; op.Reason != "LEASE_EXPIRED" || !h.Time.AsTime().Equal(later) || !op.UnknownSince.AsTime().Equal(later) {
		t.Fatalf("swept = %v, want LEASE_EXPIRED at the store's %v", op, later)
	}
}
