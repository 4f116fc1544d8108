package server_test

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

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
	const lease = 200 * time.Millisecond                 // short.* in testPolicy

	idem, irrev := a.id("sync"), a.id("refund")
	first := a.reserveAs(t, idem, "short.idempotent", 0, newHolder()).Operation
	a.reserveAs(t, irrev, "short.refund", 0, newHolder())
	if !first.CreatedAt.AsTime().Equal(storeNow) || !first.LeaseExpiresAt.AsTime().Equal(storeNow.Add(lease)) {
		t.Fatalf("created_at %v, lease_expires_at %v; want the store's %v and %v",
			first.CreatedAt.AsTime(), first.LeaseExpiresAt.AsTime(), storeNow, storeNow.Add(lease))
	}

	// The other instance, asked by another holder, finds the lease live.
	res := b.reserveAs(t, idem, "short.idempotent", 0, newHolder())
	if res.Decision != inProg || res.RetryAfter.AsDuration() <= 0 || res.RetryAfter.AsDuration() > lease {
		t.Fatalf("Reserve by another holder through the other instance = %v, want IN_PROGRESS within the lease", res)
	}
	time.Sleep(3 * lease) // the instances' clocks move on; the store's does not
	if op := b.lookup(t, irrev); op.State != running {
		t.Fatalf("the irreversible claim is %v before the store's clock passed its lease, want RUNNING", op.State)
	}
	if res := b.reserveAs(t, idem, "short.idempotent", 0, newHolder()); res.Decision != inProg {
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
	res = b.reserveAs(t, idem, "short.idempotent", 0, newHolder())
	if res.Decision != execute || res.Operation.Attempt != 2 || !res.Operation.UpdatedAt.AsTime().Equal(later) {
		t.Fatalf("Reserve after the store's clock passed the lease = %v, want EXECUTE attempt 2 at %v", res, later)
	}
	op := b.waitState(t, irrev, unknown)
	if h := op.History[len(op.History)-1]; op.Reason != "LEASE_EXPIRED" || !h.Time.AsTime().Equal(later) || !op.UnknownSince.AsTime().Equal(later) {
		t.Fatalf("swept = %v, want LEASE_EXPIRED at the store's %v", op, later)
	}
}
