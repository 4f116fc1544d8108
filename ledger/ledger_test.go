package ledger

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/fingerprint"
)

func TestReserveCreatesRunningClaim(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		res := e.reserve(t, "op-1", "payments.refund", map[string]any{"amount": 10.0}, "h1")
		if res.Decision != DecisionExecute {
			t.Fatalf("decision = %v, want EXECUTE", res.Decision)
		}
		o := res.Operation
		if o.State != StateRunning || o.Attempt != 1 || o.FencingToken == 0 || o.Effect != EffectIrreversible {
			t.Fatalf("snapshot = %+v", o)
		}
		if !o.LeaseExpiresAt.After(o.CreatedAt) || o.MaxAttempts != 3 {
			t.Fatalf("lease %v created %v max %d", o.LeaseExpiresAt, o.CreatedAt, o.MaxAttempts)
		}
		k := e.opKeys("op-1")
		if n, _ := e.rdb.ZCard(e.ctx, k.all[1]).Result(); n != 1 {
			t.Fatalf("unresolved index holds %d, want 1", n)
		}
		if s, err := e.rdb.ZScore(e.ctx, k.all[2], k.member).Result(); err != nil || int64(s) != o.LeaseExpiresAt.UnixMilli() {
			t.Fatalf("lease index score %v (%v), want %d", s, err, o.LeaseExpiresAt.UnixMilli())
		}
		if ttl, _ := e.rdb.PTTL(e.ctx, k.all[0]).Result(); ttl != -1 {
			t.Fatalf("non-terminal record has TTL %v; it must never expire", ttl)
		}
		got := e.lookup(t, "op-1")
		if !slices.Equal(reasons(got), []string{"RESERVED"}) || got.History[0].From != StateUnspecified || got.History[0].To != StateRunning {
			t.Fatalf("history = %+v", got.History)
		}
		if got.History[0].Principal != "agent-1" {
			t.Fatalf("principal = %q", got.History[0].Principal)
		}
	})
}

func TestReserveConflictLeavesRecordUntouched(t *testing.T) { // S4
	eachBackend(t, func(t *testing.T, e *env) {
		e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0, "memo": "a"}, "h1")
		before, err := e.rdb.Get(e.ctx, e.opKeys("op").all[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			req  ReserveRequest
			want []string
		}{
			{ReserveRequest{Tool: "payments.refund", Params: map[string]any{"amount": 11.0, "memo": "a"}, PermitID: "permit-1"}, []string{"params"}},
			{ReserveRequest{Tool: "payments.refund", Params: map[string]any{"amount": 10.0, "memo": "b"}, PermitID: "permit-1"}, []string{"params"}},
			{ReserveRequest{Tool: "payments.charge", Params: map[string]any{"amount": 10.0, "memo": "a"}, PermitID: "permit-1"}, []string{"tool"}},
			{ReserveRequest{Tool: "payments.refund", Params: map[string]any{"amount": 10.0, "memo": "a"}, PermitID: "permit-2"}, []string{"permit"}},
			{ReserveRequest{Tool: "x.y", Params: map[string]any{}, PermitID: ""}, []string{"tool", "params", "permit"}},
		}
		for _, c := range cases {
			c.req.OperationID, c.req.Holder = "op", "h1"
			_, err := e.l.Reserve(e.ctx, e.who, c.req)
			if ke := wantKind(t, err, KindKeyReused); !slices.Equal(ke.Differs, c.want) {
				t.Errorf("differs = %v, want %v", ke.Differs, c.want)
			}
		}
		if after, _ := e.rdb.Get(e.ctx, e.opKeys("op").all[0]).Result(); after != before {
			t.Fatalf("record changed: %q, then %q", before, after)
		}
	})
}

func TestReserveParamsSHA256EqualsParams(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		params := map[string]any{"amount": 10.5, "currency": "EUR", "memo": "ignored"}
		e.reserve(t, "op", "fields.refund", params, "h1")
		fp, err := fingerprint.Compute(params, []string{"/amount", "/currency"})
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "fields.refund", ParamsSHA256: fp[:], PermitID: "permit-1", Holder: "h1"})
		if err != nil || res.Decision != DecisionExecute {
			t.Fatalf("Reserve with params_sha256 = %v, %v; want the same claim", res, err)
		}
		// Only the consequential fields count: a changed memo is the same request.
		res = e.reserve(t, "op", "fields.refund", map[string]any{"amount": 10.5, "currency": "EUR", "memo": "other"}, "h1")
		if res.Decision != DecisionExecute {
			t.Fatalf("decision = %v", res.Decision)
		}
		_, err = e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "fields.refund", Params: map[string]any{"amount": 10.5, "currency": "USD"}, PermitID: "permit-1", Holder: "h1"})
		wantKind(t, err, KindKeyReused)
	})
}

func TestCompleteSucceeded(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "payments.refund")
		r := &Result{Data: []byte(`{"refund_id":"r-1"}`), ResourceID: "r-1"}
		done, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if done.State != StateSucceeded || string(done.Result.Data) != `{"refund_id":"r-1"}` || done.Result.ResourceID != "r-1" {
			t.Fatalf("completed = %+v", done)
		}
		k := e.opKeys("op")
		if n, _ := e.rdb.ZCard(e.ctx, k.all[1]).Result(); n != 0 {
			t.Fatalf("terminal operation still in the unresolved index")
		}
		if inLeaseIndex(e, "op") {
			t.Fatalf("terminal operation still in the lease index")
		}
		// One key holds the record, its history and, after the retention,
		// its tombstone: it lives until the end of the tombstone retention.
		ttl, _ := e.rdb.PTTL(e.ctx, k.all[0]).Result()
		if want := time.Until(done.ExpiresAt) + DefaultPolicy.TombstoneRetention; ttl <= 0 || ttl > want+time.Second || ttl < want-time.Minute {
			t.Fatalf("record TTL %v after the terminal transition, want about %v", ttl, want)
		}
		stored, _ := e.rdb.Get(e.ctx, k.all[0]).Result()
		if tomb, _, err := decodeRecord(stored); err != nil || tomb.State != StateSucceeded || tomb.Fingerprint != o.Fingerprint {
			t.Fatalf("stored record = %+v, %v; want the final state and the fingerprint", tomb, err)
		}
		// A repeat succeeds again, without a second history entry.
		again, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, r, nil)
		if err != nil || again.State != StateSucceeded {
			t.Fatalf("repeat = %v, %v", again, err)
		}
		if got := reasons(e.lookup(t, "op")); !slices.Equal(got, []string{"RESERVED", "SUCCEEDED"}) {
			t.Fatalf("history = %v", got)
		}
		// Another outcome under the same token is a conflict.
		_, err = e.complete(t, "op", o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r-2"}, nil)
		wantKind(t, err, KindCompletionConflict)
		_, err = e.complete(t, "op", o.FencingToken, OutcomeFailedFinal, nil, &Failure{Code: "x"})
		wantKind(t, err, KindCompletionConflict)
		// And Reserve replays the result.
		res := e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0}, "h-other")
		if res.Decision != DecisionReplay || res.Operation.Result.ResourceID != "r-1" {
			t.Fatalf("Reserve after success = %v %+v", res.Decision, res.Operation.Result)
		}
	})
}

func TestSweeper(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		e.execute(t, "irrev", "expiring.refund")
		e.execute(t, "idem", "expiring.idempotent")
		e.execute(t, "live", "payments.refund")
		// Lease index members no ledger wrote (no separator, a bad
		// encoding), long expired, in irrev's shard: the sweep drops them
		// and carries on with the others.
		leases := e.opKeys("irrev").all[2]
		foreign := []string{"no-separator", "%zz:%zz"}
		for _, m := range foreign {
			if err := e.rdb.ZAdd(e.ctx, leases, redis.Z{Score: 1, Member: m}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		waitLeaseExpiry()
		// Other tests share the store: count only this tenant's operations.
		for range 2 {
			e.sweep(t)
		}
		for _, m := range foreign {
			if err := e.rdb.ZScore(e.ctx, leases, m).Err(); !errors.Is(err, redis.Nil) {
				t.Fatalf("the foreign lease member %q after the sweep: %v, want it gone", m, err)
			}
		}
		irrev := e.lookup(t, "irrev")
		if irrev.State != StateUnknown || irrev.Reason != "LEASE_EXPIRED" || irrev.History[1].Principal != SweeperPrincipal {
			t.Fatalf("irreversible after sweep = %+v", irrev)
		}
		if len(irrev.History) != 2 {
			t.Fatalf("a second sweep added history: %v", reasons(irrev))
		}
		if idem := e.lookup(t, "idem"); idem.State != StateRunning {
			t.Fatalf("idempotent after sweep = %v, want RUNNING past its lease", idem.State)
		}
		if inLeaseIndex(e, "idem") {
			t.Fatalf("idempotent operation still in the lease index")
		}
		if live := e.lookup(t, "live"); live.State != StateRunning {
			t.Fatalf("live claim swept: %v", live.State)
		}
	})
}

func TestTombstone(t *testing.T) { // S6 at the script level
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "brief.refund")
		if _, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil); err != nil {
			t.Fatal(err)
		}
		// The record is its own tombstone after its retention.
		stored, _ := e.rdb.Get(e.ctx, e.opKeys("op").all[0]).Result()
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := e.l.Lookup(e.ctx, e.who, "op")
			if err != nil {
				if ee := wantKind(t, err, KindKeyExpired); ee.State != StateSucceeded {
					t.Fatalf("expired state = %v", ee.State)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("record never expired")
			}
			time.Sleep(100 * time.Millisecond)
		}
		_, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "brief.refund", Params: map[string]any{"amount": 10.0}, PermitID: "permit-1", Holder: "late"})
		wantKind(t, err, KindKeyExpired)
		if now, _ := e.rdb.Get(e.ctx, e.opKeys("op").all[0]).Result(); now != stored {
			t.Fatal("a late Reserve re-created the record")
		}
	})
}

func TestRetainUntilExtendsRetention(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		until := time.Now().Add(48 * time.Hour)
		res, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "brief.book", PermitID: "p", Holder: "h", RetainUntil: until})
		if err != nil {
			t.Fatal(err)
		}
		done, err := e.complete(t, "op", res.Operation.FencingToken, OutcomeSucceeded, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		// brief.* has retention 1s and no grace: retain_until decides.
		if d := done.ExpiresAt.Sub(until); d < -time.Second || d > time.Second {
			t.Fatalf("expires at %v, want about %v", done.ExpiresAt, until)
		}
		ttl, _ := e.rdb.PTTL(e.ctx, e.opKeys("op").all[0]).Result()
		if ttl < 47*time.Hour {
			t.Fatalf("record TTL %v, want about 48h", ttl)
		}
	})
}

func TestInvalidInputChangesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		long := make([]byte, 10<<10)
		for i := range long {
			long[i] = 'a'
		}
		bad := []ReserveRequest{
			{OperationID: "", Tool: "t"},
			{OperationID: "a\nb", Tool: "t"},
			{OperationID: "a\x00b", Tool: "t"},
			{OperationID: "\xff\xfe", Tool: "t"},
			{OperationID: string(long), Tool: "t"},
			{OperationID: "ok", Tool: ""},
			{OperationID: "ok", Tool: "bad tool*"},
			{OperationID: "ok", Tool: "t", Effect: 9},
			{OperationID: "ok", Tool: "t", ParamsSHA256: []byte{1, 2}},
			{OperationID: "ok", Tool: "t", ParamsSHA256: make([]byte, 32), Params: map[string]any{}},
			{OperationID: "ok", Tool: "t", Params: map[string]any{"x": nan()}},
			{OperationID: "ok", Tool: "t", Holder: string(long)},
			{OperationID: "ok", Tool: "t", RetainUntil: time.Now().Add(20 * 365 * 24 * time.Hour)},
		}
		for _, req := range bad {
			_, err := e.l.Reserve(e.ctx, e.who, req)
			ie := wantKind(t, err, KindInvalid)
			if len(ie.Violations) == 0 {
				t.Fatalf("no violations for %q", req.OperationID)
			}
		}
		for _, call := range []func() error{
			func() error { _, err := e.complete(t, "ok", 0, OutcomeSucceeded, nil, nil); return err },
			func() error { _, err := e.complete(t, "ok", 1, 0, nil, nil); return err },
			func() error { _, err := e.complete(t, "ok", 1, OutcomeFailedFinal, &Result{}, nil); return err },
			func() error {
				_, err := e.complete(t, "ok", 1, OutcomeSucceeded, &Result{Data: []byte("[1]")}, nil)
				return err
			},
			func() error {
				_, err := e.complete(t, "ok", 1, OutcomeFailedRetryable, nil, &Failure{Code: "c", Detail: "d"})
				return err
			},
			func() error {
				_, err := e.complete(t, "ok", 1, OutcomeFailedFinal, nil, &Failure{Detail: strings.Repeat("d", MaxFailureDetail+1)})
				return err
			},
			func() error {
				_, err := e.complete(t, "ok", 1, OutcomeFailedFinal, nil, &Failure{Detail: "\xff"})
				return err
			},
			func() error {
				_, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: "ok", Finding: FindingAbandon, Failure: &Failure{Detail: "d"}})
				return err
			},
			func() error { _, err := e.reconcile(t, "ok", 0, nil); return err },
			func() error { _, err := e.reconcile(t, "ok", FindingNotApplied, &Result{}); return err },
			func() error {
				_, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{PageToken: "garbage!"})
				return err
			},
			func() error {
				_, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{States: []State{StateSucceeded}})
				return err
			},
		} {
			wantKind(t, call(), KindInvalid)
		}
		n, err := countKeys(e, e.who.Tenant)
		if err != nil || n != 0 {
			t.Fatalf("refused requests wrote %d keys (%v)", n, err)
		}
	})
}

// countKeys counts the keys that name the tenant (on every master of a
// cluster).
func countKeys(e *env, tenant string) (int, error) {
	pattern := "*:" + encodeComponent(tenant) + "*"
	if cc, ok := e.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		n := 0
		err := cc.ForEachMaster(e.ctx, func(ctx context.Context, c *redis.Client) error {
			keys, err := c.Keys(ctx, pattern).Result()
			mu.Lock()
			n += len(keys)
			mu.Unlock()
			return err
		})
		return n, err
	}
	keys, err := e.rdb.Keys(e.ctx, pattern).Result()
	return len(keys), err
}

func TestConsequentialFieldsBoundAtCreation(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// Created while the policy fingerprints only amount and currency.
		e.reserve(t, "op", "fields.refund", map[string]any{"amount": 10.0, "currency": "EUR", "memo": "a"}, "h1")
		// Another instance (or a reloaded policy) fingerprints every field.
		all, err := New(e.rdb, Options{})
		if err != nil {
			t.Fatal(err)
		}
		retry := func(l *Ledger, params map[string]any) (*ReserveResult, error) {
			return l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "fields.refund", Params: params, PermitID: "permit-1", Holder: "h1"})
		}
		res, err := retry(all, map[string]any{"amount": 10.0, "currency": "EUR", "memo": "b"})
		if err != nil || res.Decision != DecisionExecute {
			t.Fatalf("retry under the changed policy = %v, %v; want the same claim", res, err)
		}
		_, err = retry(all, map[string]any{"amount": 11.0, "currency": "EUR", "memo": "a"})
		wantKind(t, err, KindKeyReused)

		// And the other way round: created over all fields, retried under a
		// policy that names fields.
		if _, err := all.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op2", Tool: "fields.refund", Params: map[string]any{"amount": 1.0, "memo": "x"}, PermitID: "p", Holder: "h"}); err != nil {
			t.Fatal(err)
		}
		_, err = e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op2", Tool: "fields.refund", Params: map[string]any{"amount": 1.0, "memo": "y"}, PermitID: "p", Holder: "h"})
		wantKind(t, err, KindKeyReused)
		res, err = e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op2", Tool: "fields.refund", Params: map[string]any{"memo": "x", "amount": 1.0}, PermitID: "p", Holder: "h"})
		if err != nil || res.Decision != DecisionExecute {
			t.Fatalf("same params under the narrower policy = %v, %v", res, err)
		}
	})
}

func TestLateSuccessCorrectsConcludedFailure(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// The last attempt's lease runs out; a reconciler finds nothing yet;
		// the ledger concludes the operation failed for good.
		var last *Operation
		for range 3 {
			last = e.reserve(t, "op", "expiring.refund", map[string]any{"amount": 10.0}, "h").Operation
			if last.Attempt < 3 {
				if _, err := e.complete(t, "op", last.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		waitLeaseExpiry()
		if res := e.reserve(t, "op", "expiring.refund", map[string]any{"amount": 10.0}, "h2"); res.Decision != DecisionReconcile {
			t.Fatalf("decision = %v", res.Decision)
		}
		if _, err := e.reconcile(t, "op", FindingNotApplied, nil); err != nil {
			t.Fatal(err)
		}
		res := e.reserve(t, "op", "expiring.refund", map[string]any{"amount": 10.0}, "h3")
		if res.Operation.State != StateFailedFinal || res.Operation.Reason != "RETRIES_EXHAUSTED" {
			t.Fatalf("after exhaustion = %+v", res.Operation)
		}
		// The slow worker did apply it, and says so with the latest token.
		done, err := e.complete(t, "op", last.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil)
		if err != nil || done.State != StateSucceeded || done.Result.ResourceID != "r" || done.Failure != nil {
			t.Fatalf("late success = %+v, %v", done, err)
		}
		got := e.lookup(t, "op")
		if h := got.History[len(got.History)-1]; h.From != StateFailedFinal || h.To != StateSucceeded || h.Detail != "late report after RETRIES_EXHAUSTED" {
			t.Fatalf("last history entry = %+v", h)
		}
		stored, _ := e.rdb.Get(e.ctx, e.opKeys("op").all[0]).Result()
		if tomb, _, err := decodeRecord(stored); err != nil || tomb.State != StateSucceeded {
			t.Fatalf("stored record (the tombstone after the retention) = %+v, %v", tomb, err)
		}
		if ttl, _ := e.rdb.PTTL(e.ctx, e.opKeys("op").all[0]).Result(); ttl <= 0 {
			t.Fatalf("record TTL %v after the late success", ttl)
		}
		// A final failure the worker itself reported stays final.
		o := e.execute(t, "final", "payments.refund")
		if _, err := e.complete(t, "final", o.FencingToken, OutcomeFailedFinal, nil, &Failure{Code: "declined"}); err != nil {
			t.Fatal(err)
		}
		_, err = e.complete(t, "final", o.FencingToken, OutcomeSucceeded, nil, nil)
		wantKind(t, err, KindCompletionConflict)
	})
}

// inLeaseIndex reports whether the operation has an entry in its shard's
// lease index (which other tenants' operations share).
func inLeaseIndex(e *env, id string) bool {
	k := e.opKeys(id)
	_, err := e.rdb.ZScore(e.ctx, k.all[2], k.member).Result()
	return err == nil
}

// TestUnresolvedLimit: a tenant holds at most its limit of unresolved
// operations over all shards, small or large, also when 64 Reserves race;
// retries of held operations still work, a resolved one makes room, other
// tenants are not limited by it, and two Ledgers on one store keep it when
// each reads the counts again before it decides (as it does near the limit
// once nearAge has passed).
func TestUnresolvedLimit(t *testing.T) {
	cases := []struct {
		name    string
		limit   int
		ledgers int // sharing the store, called in turn
		racing  int // concurrent Reserves first
	}{
		{"one", 1, 1, 0},
		{"ten", 10, 1, 0},
		{"one per shard", NumShards, 1, 0},
		{"a thousand", 1000, 1, 0},
		{"ten, 64 racing", 10, 1, 64},
		{"ten, two ledgers", 10, 2, 0},
	}
	eachBackend(t, func(t *testing.T, e *env) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				who := e.who
				who.Tenant += "-" + randomHex(4)
				var ls []*Ledger
				for range c.ledgers {
					l, err := New(e.lrdb, Options{Policies: e.l.policies, UnresolvedLimit: func(tenant string) int {
						if tenant == who.Tenant {
							return c.limit
						}
						return 0
					}})
					if err != nil {
						t.Fatal(err)
					}
					ls = append(ls, l)
				}
				reserve := func(l *Ledger, who Principal, id string) (*ReserveResult, error) {
					return l.Reserve(e.ctx, who, ReserveRequest{OperationID: id, Tool: "payments.refund", PermitID: "p", Holder: "h"})
				}
				var held []string
				n := 0
				next := func() string { n++; return "op-" + itoa(int64(n)) }
				if c.racing > 0 {
					var mu sync.Mutex
					var wg sync.WaitGroup
					for range c.racing {
						id := next()
						wg.Go(func() {
							_, err := reserve(ls[0], who, id)
							mu.Lock()
							defer mu.Unlock()
							switch {
							case err == nil:
								held = append(held, id)
							case KindOf(err) != KindQuotaExceeded:
								t.Error(err)
							}
						})
					}
					wg.Wait()
					if len(held) > c.limit {
						t.Fatalf("%d racing Reserves created %d operations, limit %d", c.racing, len(held), c.limit)
					}
				}
				for i := 0; len(held) < c.limit; i++ {
					l := ls[i%len(ls)]
					if len(ls) > 1 {
						time.Sleep(nearAge + 5*time.Millisecond) // the other's counts are stale
					}
					id := next()
					if _, err := reserve(l, who, id); err != nil {
						t.Fatalf("%s, holding %d of %d: %v", id, len(held), c.limit, err)
					}
					held = append(held, id)
				}
				refused := next()
				for _, l := range ls {
					time.Sleep(nearAge + 5*time.Millisecond)
					if _, err := reserve(l, who, refused); KindOf(err) != KindQuotaExceeded {
						t.Fatalf("a new operation beyond the limit: %v, want KindQuotaExceeded", err)
					}
				}
				if got := unresolvedOf(t, e, who.Tenant); got != c.limit {
					t.Fatalf("%d unresolved operations, limit %d", got, c.limit)
				}
				// The latest held claim: an early one's lease may have ended
				// while a thousand were reserved.
				last := held[len(held)-1]
				res, err := reserve(ls[0], who, last)
				if err != nil || res.Decision != DecisionExecute {
					t.Fatalf("retry under the limit = %v, %v", res, err)
				}
				if _, err := ls[0].Complete(e.ctx, who, CompleteRequest{OperationID: last, FencingToken: res.Operation.FencingToken, Outcome: OutcomeSucceeded}); err != nil {
					t.Fatal(err)
				}
				if _, err := reserve(ls[len(ls)-1], who, refused); err != nil {
					t.Fatalf("after resolving one: %v", err)
				}
				other := who
				other.Tenant += "-other"
				if _, err := reserve(ls[0], other, next()); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// unresolvedOf counts a tenant's unresolved operations in every shard.
func unresolvedOf(t *testing.T, e *env, tenant string) int {
	t.Helper()
	n := 0
	for s := range NumShards {
		c, err := e.rdb.ZCard(e.ctx, e.l.keys.unresolved(s, encodeComponent(tenant))).Result()
		if err != nil {
			t.Fatal(err)
		}
		n += int(c)
	}
	return n
}

// liveFor returns the live counts of one tenant by state.
func liveFor(t *testing.T, e *env) map[State]int64 {
	t.Helper()
	counts, err := e.l.LiveCounts(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[State]int64{}
	for _, c := range counts {
		if c.Tenant == e.who.Tenant {
			out[c.State] += c.N
		}
	}
	return out
}

// TestLiveCountsAndOverdue: the live counts follow every state, and an
// operation nothing moves within its recovery window is overdue: UNKNOWN,
// PENDING that nobody retries, and an idempotent claim past its lease (once
// swept); an irreversible claim past its lease becomes UNKNOWN instead.
// Moving it (a finding, a retry, a reclaim, a Complete) ends that.
func TestLiveCountsAndOverdue(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		pol, err := ParsePolicies([]byte("tools:\n  - match: \"tiny.lookup\"\n    effect: IDEMPOTENT\n    lease: 20ms\n    recovery_window: 3s\n" +
			"  - match: \"tiny.*\"\n    recovery_window: 50ms\n"))
		if err != nil {
			t.Fatal(err)
		}
		l, err := New(e.lrdb, Options{Policies: pol})
		if err != nil {
			t.Fatal(err)
		}
		e.l = l
		e.execute(t, "running", "tiny.refund")
		p := e.execute(t, "pending", "tiny.refund")
		if _, err := e.complete(t, "pending", p.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
			t.Fatal(err)
		}
		u := e.execute(t, "unknown", "tiny.refund")
		if _, err := e.markUnknown(t, "unknown", u.FencingToken); err != nil {
			t.Fatal(err)
		}
		d := e.execute(t, "done", "tiny.refund")
		if _, err := e.complete(t, "done", d.FencingToken, OutcomeSucceeded, nil, nil); err != nil {
			t.Fatal(err)
		}
		abandoned := e.execute(t, "abandoned", "tiny.lookup")
		got := liveFor(t, e)
		if got[StateRunning] != 2 || got[StatePending] != 1 || got[StateUnknown] != 1 || len(got) != 3 {
			t.Fatalf("live counts = %v", got)
		}
		overdue := func() map[string]int64 {
			t.Helper()
			ov, err := e.l.Overdue(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]int64{}
			for _, o := range ov {
				if o.Tenant == e.who.Tenant {
					out[o.Tool+" "+o.Effect.String()+" "+o.State.String()] += o.N
				}
			}
			return out
		}
		time.Sleep(100 * time.Millisecond)
		if _, err := e.l.Sweep(e.ctx); err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{
			"tiny.refund IRREVERSIBLE UNKNOWN": 1,
			"tiny.refund IRREVERSIBLE PENDING": 1,
		}
		if got := overdue(); !maps.Equal(got, want) {
			t.Fatalf("overdue = %v, want %v", got, want)
		}
		time.Sleep(time.Until(abandoned.LeaseExpiresAt.Add(3*time.Second + 50*time.Millisecond))) // lease end + window
		want["tiny.lookup IDEMPOTENT RUNNING"] = 1
		if got := overdue(); !maps.Equal(got, want) {
			t.Fatalf("overdue = %v, want %v", got, want)
		}
		if _, err := e.reconcile(t, "unknown", FindingApplied, nil); err != nil {
			t.Fatal(err)
		}
		if r := e.reserve(t, "abandoned", "tiny.lookup", map[string]any{"amount": 10.0}, "h2"); r.Decision != DecisionExecute || r.Operation.Attempt != 2 {
			t.Fatalf("reclaim = %v, attempt %d", r.Decision, r.Operation.Attempt)
		}
		want = map[string]int64{"tiny.refund IRREVERSIBLE PENDING": 1}
		if got := overdue(); !maps.Equal(got, want) {
			t.Fatalf("overdue after moving them = %v, want %v", got, want)
		}
		if r := e.reserve(t, "pending", "tiny.refund", map[string]any{"amount": 10.0}, "h2"); r.Decision != DecisionExecute {
			t.Fatalf("retry of the pending one = %v", r.Decision)
		}
		if got := overdue(); len(got) != 0 {
			t.Fatalf("overdue after the retry = %v, want none", got)
		}
		if got := liveFor(t, e); got[StateUnknown] != 0 || got[StateRunning] != 3 || got[StatePending] != 0 {
			t.Fatalf("live counts after moving them = %v", got)
		}
	})
}

func TestObserverSeesTransitionsDecisionsAndRefusals(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		seen := observe(t, e)
		o := e.execute(t, "op", "payments.refund")
		time.Sleep(5 * time.Millisecond)
		if _, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, nil, nil); err != nil {
			t.Fatal(err)
		}
		_, _ = e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "payments.refund", Params: map[string]any{"amount": 1.0}, PermitID: "permit-1", Holder: "h"})
		_, _ = e.complete(t, "op", o.FencingToken+1, OutcomeSucceeded, nil, nil)
		var kinds []string
		for _, ev := range seen() {
			switch ev.Type {
			case EventTransition:
				kinds = append(kinds, "transition:"+ev.From.String()+">"+ev.To.String()+":"+ev.Reason)
				if ev.To == StateSucceeded && ev.Dwell <= 0 {
					t.Errorf("no dwell time in RUNNING: %+v", ev)
				}
			case EventDecision:
				kinds = append(kinds, "decision:"+ev.Decision.String())
			case EventConflict:
				kinds = append(kinds, "conflict:"+strings.Join(ev.Differs, ","))
			case EventRefused:
				kinds = append(kinds, "refused:"+ev.ErrKind.String())
			}
			if ev.Type != EventScript && ev.Tenant != e.who.Tenant {
				t.Errorf("event without the tenant: %+v", ev)
			}
		}
		want := "transition:UNSPECIFIED>RUNNING:RESERVED decision:EXECUTE transition:RUNNING>SUCCEEDED:SUCCEEDED conflict:params refused:stale fencing token"
		if strings.Join(kinds, " ") != want {
			t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(kinds, " "), want)
		}
	})
}

// TestObserverSeesRenewsLeaseExpiry: a Renew that finds an irreversible
// operation's lease over moves it to UNKNOWN (LEASE_EXPIRED) itself, and
// reports that transition, with its dwell in RUNNING, as the sweeper's
// would be.
func TestObserverSeesRenewsLeaseExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		seen := observe(t, e)
		unswept(func() {
			o := e.execute(t, "renewed-late", "expiring.refund")
			waitLeaseExpiry()
			_, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "renewed-late", FencingToken: o.FencingToken})
			if le := wantKind(t, err, KindStaleToken); le.State != StateUnknown {
				t.Fatalf("Renew after the lease: state %v, want UNKNOWN", le.State)
			}
		})
		var moves []Event
		for _, ev := range seen() {
			if ev.Type == EventTransition && ev.To == StateUnknown {
				moves = append(moves, ev)
			}
		}
		if len(moves) != 1 || moves[0].From != StateRunning || moves[0].Reason != "LEASE_EXPIRED" || moves[0].Op != "Renew" || moves[0].Dwell < 150*time.Millisecond {
			t.Fatalf("transitions to UNKNOWN: %+v, want Renew's RUNNING > UNKNOWN (LEASE_EXPIRED) after its lease", moves)
		}
	})
}

// observe gives e a ledger on the same store whose events are kept, and
// returns what it has seen so far.
func observe(t *testing.T, e *env) func() []Event {
	t.Helper()
	var mu sync.Mutex
	var events []Event
	l, err := New(e.lrdb, Options{Policies: e.l.policies, Observer: func(ev Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}})
	if err != nil {
		t.Fatal(err)
	}
	e.l = l
	return func() []Event {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(events)
	}
}

// TestReserveTable: every row of contract.md §4's Reserve table, with the
// decision, the record it leaves and the history entry it writes.
func TestReserveTable(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		t.Run("none", func(t *testing.T) {
			res := e.reserveAs(t, "none", "payments.refund", 0, "h-none")
			o := res.Operation
			if res.Decision != DecisionExecute || o.State != StateRunning || o.Attempt != 1 || o.FencingToken == 0 ||
				res.Holder != "h-none" || !o.LeaseExpiresAt.After(o.CreatedAt) || o.Effect != EffectIrreversible || o.MaxAttempts != 3 {
				t.Fatalf("Reserve of a new id = %+v", res)
			}
			h := e.lastEntry(t, "none")
			if h.Reason != "RESERVED" || h.From != StateUnspecified || h.To != StateRunning || h.Principal != "agent-1" {
				t.Fatalf("history = %+v", h)
			}
		})

		t.Run("PENDING", func(t *testing.T) {
			first := e.claim(t, "pending", "payments.refund", 0)
			e.settle(t, "pending", first.FencingToken, OutcomeFailedRetryable, "503")
			res := e.reserveAs(t, "pending", "payments.refund", 0, "h-2")
			if o := res.Operation; res.Decision != DecisionExecute || o.State != StateRunning || o.Attempt != 2 ||
				o.FencingToken <= first.FencingToken || o.Failure != nil {
				t.Fatalf("Reserve of a PENDING operation = %+v", res)
			}
			if h := e.lastEntry(t, "pending"); h.Reason != "CLAIMED" || h.From != StatePending || h.To != StateRunning || h.Attempt != 2 {
				t.Fatalf("history = %+v", h)
			}
		})

		t.Run("PENDING, attempts exhausted", func(t *testing.T) {
			for attempt := range 3 {
				o := e.claim(t, "exhausted", "payments.refund", 0)
				if o.Attempt != uint32(attempt+1) {
					t.Fatalf("attempt %d, want %d", o.Attempt, attempt+1)
				}
				e.settle(t, "exhausted", o.FencingToken, OutcomeFailedRetryable, "503")
			}
			res := e.reserveAs(t, "exhausted", "payments.refund", 0, "h-4")
			if o := res.Operation; res.Decision != DecisionReplay || o.State != StateFailedFinal || o.Reason != "RETRIES_EXHAUSTED" ||
				o.Failure.Code != "RETRIES_EXHAUSTED" || o.Attempt != 3 {
				t.Fatalf("Reserve with no attempts left = %+v", res)
			}
			if h := e.lastEntry(t, "exhausted"); h.Reason != "RETRIES_EXHAUSTED" || h.From != StatePending || h.To != StateFailedFinal || h.Attempt != 3 {
				t.Fatalf("history = %+v", h)
			}
			before := e.lookup(t, "exhausted")
			if again := e.reserveAs(t, "exhausted", "payments.refund", 0, "h-5"); again.Decision != DecisionReplay || again.Operation.State != StateFailedFinal {
				t.Fatalf("Reserve again = %+v, want REPLAY of the failure", again)
			}
			e.wantUnchanged(t, "exhausted", before)
		})

		t.Run("RUNNING, lease valid, same holder", func(t *testing.T) { // S10
			first := e.reserveAs(t, "same-holder", "payments.refund", 0, "h-1")
			before := e.lookup(t, "same-holder")
			again := e.reserveAs(t, "same-holder", "payments.refund", 0, "h-1")
			if again.Decision != DecisionExecute || again.Operation.Attempt != 1 || again.Operation.FencingToken != first.Operation.FencingToken {
				t.Fatalf("Reserve by the same holder = %+v, want EXECUTE with attempt 1, token %d", again, first.Operation.FencingToken)
			}
			e.wantUnchanged(t, "same-holder", before)
		})

		t.Run("RUNNING, lease valid, other holder", func(t *testing.T) {
			e.claim(t, "other-holder", "payments.refund", 0)
			before := e.lookup(t, "other-holder")
			res := e.reserveAs(t, "other-holder", "payments.refund", 0, "h-other")
			if res.Decision != DecisionInProgress || res.RetryAfter < minRetryAfter || res.RetryAfter > maxRetryAfter {
				t.Fatalf("Reserve by another holder = %+v, want IN_PROGRESS with retry_after", res)
			}
			e.wantUnchanged(t, "other-holder", before)
		})

		for _, effect := range []Effect{EffectIdempotent, EffectReadOnly} {
			t.Run("RUNNING, lease expired, "+effect.String(), func(t *testing.T) {
				id := "reclaim-" + effect.String()
				first := e.reserveAs(t, id, "expiring.refund", effect, "h-1").Operation
				e.waitLeaseEnd(t, first)
				// The same holder too: after the lease it is anyone.
				res := e.reserveAs(t, id, "expiring.refund", effect, "h-1")
				if res.Decision != DecisionExecute || res.Operation.Attempt != 2 || res.Operation.FencingToken <= first.FencingToken {
					t.Fatalf("Reserve after the lease = %+v, want EXECUTE attempt 2 with a new token", res)
				}
				if h := e.lastEntry(t, id); h.Reason != "RECLAIMED" || h.From != StateRunning || h.To != StateRunning {
					t.Fatalf("history = %+v", h)
				}
			})
		}

		t.Run("RUNNING, lease expired, irreversible", func(t *testing.T) { // S3
			first := e.claim(t, "lapsed", "expiring.refund", 0)
			e.waitLeaseEnd(t, first)
			res := e.reserveAs(t, "lapsed", "expiring.refund", 0, "h-2")
			if o := res.Operation; res.Decision != DecisionReconcile || o.State != StateUnknown || o.Reason != "LEASE_EXPIRED" ||
				o.RecoveryDeadline.Sub(o.UnknownSince) != DefaultPolicy.RecoveryWindow {
				t.Fatalf("Reserve after the lease = %+v, want RECONCILE, UNKNOWN (LEASE_EXPIRED)", res)
			}
			if h := e.lastEntry(t, "lapsed"); h.From != StateRunning || h.To != StateUnknown || h.FencingToken != first.FencingToken {
				t.Fatalf("history = %+v", h)
			}
		})

		for _, tc := range []struct {
			effect Effect
			want   Decision
		}{{EffectIdempotent, DecisionExecute}, {EffectReadOnly, DecisionExecute}, {EffectIrreversible, DecisionReconcile}} {
			t.Run("UNKNOWN, "+tc.effect.String(), func(t *testing.T) {
				id := "unknown-" + tc.effect.String()
				first := e.reserveAs(t, id, "payments.refund", tc.effect, "h-1").Operation
				e.unknown(t, id, first.FencingToken)
				before := e.lookup(t, id)
				res := e.reserveAs(t, id, "payments.refund", tc.effect, "h-1")
				if res.Decision != tc.want {
					t.Fatalf("Reserve of an UNKNOWN %v operation = %v, want %v", tc.effect, res.Decision, tc.want)
				}
				if tc.want == DecisionReconcile {
					e.wantUnchanged(t, id, before)
					return
				}
				if o := res.Operation; o.State != StateRunning || o.Attempt != 2 || o.FencingToken <= first.FencingToken || !o.UnknownSince.IsZero() {
					t.Fatalf("reclaim = %+v", o)
				}
				if h := e.lastEntry(t, id); h.Reason != "RECLAIMED" || h.From != StateUnknown || h.To != StateRunning {
					t.Fatalf("history = %+v", h)
				}
			})
		}

		// Out of attempts, an idempotent operation whose outcome is unknown
		// is not reclaimed, nor failed for good: it may have applied the
		// effect (design.md, 3.4 rule 6).
		t.Run("UNKNOWN, idempotent, attempts exhausted", func(t *testing.T) {
			for attempt := range 3 {
				res := e.reserveAs(t, "unknown-exhausted", "payments.refund", EffectIdempotent, "h-"+itoa(int64(attempt)))
				if res.Decision != DecisionExecute || res.Operation.Attempt != uint32(attempt+1) {
					t.Fatalf("Reserve = %+v, want EXECUTE attempt %d", res, attempt+1)
				}
				e.unknown(t, "unknown-exhausted", res.Operation.FencingToken)
			}
			before := e.lookup(t, "unknown-exhausted")
			res := e.reserveAs(t, "unknown-exhausted", "payments.refund", EffectIdempotent, "h-4")
			if res.Decision != DecisionReconcile || res.Operation.State != StateUnknown || res.Operation.Attempt != 3 {
				t.Fatalf("Reserve with no attempts left = %+v, want RECONCILE", res)
			}
			e.wantUnchanged(t, "unknown-exhausted", before)
		})

		t.Run("RUNNING, lease expired, idempotent, attempts exhausted", func(t *testing.T) {
			var o *Operation
			for attempt := range 3 {
				res := e.reserveAs(t, "running-exhausted", "expiring.idempotent", 0, "h-"+itoa(int64(attempt)))
				if res.Decision != DecisionExecute || res.Operation.Attempt != uint32(attempt+1) {
					t.Fatalf("Reserve = %+v, want EXECUTE attempt %d", res, attempt+1)
				}
				o = res.Operation
				e.waitLeaseEnd(t, o)
			}
			res := e.reserveAs(t, "running-exhausted", "expiring.idempotent", 0, "h-4")
			if res.Decision != DecisionReconcile || res.Operation.State != StateUnknown || res.Operation.Reason != "RETRIES_EXHAUSTED" ||
				res.Operation.FencingToken != o.FencingToken {
				t.Fatalf("Reserve with no attempts left = %+v, want RECONCILE, UNKNOWN (RETRIES_EXHAUSTED)", res)
			}
			if h := e.lastEntry(t, "running-exhausted"); h.From != StateRunning || h.To != StateUnknown || h.Attempt != 3 {
				t.Fatalf("history = %+v", h)
			}
		})

		t.Run("SUCCEEDED", func(t *testing.T) {
			o := e.claim(t, "succeeded", "payments.refund", 0)
			e.settle(t, "succeeded", o.FencingToken, OutcomeSucceeded, "R-7")
			before := e.lookup(t, "succeeded")
			res := e.reserveAs(t, "succeeded", "payments.refund", 0, "h-2")
			if res.Decision != DecisionReplay || res.Operation.State != StateSucceeded || res.Operation.Result.ResourceID != "R-7" ||
				string(res.Operation.Result.Data) != `{"receipt":"R-7"}` {
				t.Fatalf("Reserve of a SUCCEEDED operation = %+v, want REPLAY of R-7", res)
			}
			e.wantUnchanged(t, "succeeded", before)
		})

		t.Run("FAILED_FINAL", func(t *testing.T) {
			o := e.claim(t, "failed", "payments.refund", 0)
			e.settle(t, "failed", o.FencingToken, OutcomeFailedFinal, "card_declined")
			before := e.lookup(t, "failed")
			res := e.reserveAs(t, "failed", "payments.refund", 0, "h-2")
			if res.Decision != DecisionReplay || res.Operation.State != StateFailedFinal ||
				*res.Operation.Failure != (Failure{Code: "card_declined", Message: "refused by the destination"}) {
				t.Fatalf("Reserve of a FAILED_FINAL operation = %+v, want REPLAY of the failure", res)
			}
			e.wantUnchanged(t, "failed", before)
		})
	})
}

// TestCompleteRules: contract.md §4's rules for Complete: only the current
// token, from RUNNING and from UNKNOWN with the latest token, a retryable
// failure back to PENDING, a repeat of the same outcome succeeds, another
// outcome is a completion conflict.
func TestCompleteRules(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		t.Run("from RUNNING", func(t *testing.T) {
			o := e.claim(t, "running", "payments.refund", 0)
			done := e.settle(t, "running", o.FencingToken, OutcomeSucceeded, "R-1")
			if done.State != StateSucceeded || done.Result.ResourceID != "R-1" || !done.LeaseExpiresAt.IsZero() {
				t.Fatalf("Complete = %+v", done)
			}
			if h := e.lastEntry(t, "running"); h.Reason != "SUCCEEDED" || h.From != StateRunning || h.To != StateSucceeded {
				t.Fatalf("history = %+v", h)
			}
		})

		t.Run("from UNKNOWN by MarkUnknown, latest token", func(t *testing.T) {
			for _, out := range []Outcome{OutcomeSucceeded, OutcomeFailedFinal} {
				id := "marked-" + outcomeNames[out]
				o := e.claim(t, id, "payments.refund", 0)
				e.unknown(t, id, o.FencingToken)
				done := e.settle(t, id, o.FencingToken, out, "late")
				want := map[Outcome]State{OutcomeSucceeded: StateSucceeded, OutcomeFailedFinal: StateFailedFinal}[out]
				if done.State != want || done.NeedsReview || !done.UnknownSince.IsZero() {
					t.Fatalf("Complete(%v) from UNKNOWN = %+v", out, done)
				}
				if h := e.lastEntry(t, id); h.From != StateUnknown || h.To != want {
					t.Fatalf("history = %+v", h)
				}
			}
		})

		t.Run("from UNKNOWN by lease expiry, latest token", func(t *testing.T) {
			o := e.claim(t, "expired", "expiring.refund", 0)
			e.expire(t, o)
			done := e.settle(t, "expired", o.FencingToken, OutcomeSucceeded, "R-late")
			if done.State != StateSucceeded || done.Result.ResourceID != "R-late" {
				t.Fatalf("a late but authoritative Complete = %+v", done)
			}
			if got := reasons(e.lookup(t, "expired")); !slices.Equal(got, []string{"RESERVED", "LEASE_EXPIRED", "SUCCEEDED"}) {
				t.Fatalf("history = %v", got)
			}
			res := e.reserveAs(t, "expired", "expiring.refund", 0, "h-2")
			if res.Decision != DecisionReplay || res.Operation.Result.ResourceID != "R-late" {
				t.Fatalf("Reserve after = %+v", res)
			}
		})

		// The sweeper made the claim UNKNOWN, a reconciler found nothing,
		// then the worker finishes: its report wins, so the next claim
		// cannot repeat it.
		t.Run("from PENDING by a finding, latest token", func(t *testing.T) {
			o := e.claim(t, "found-nothing", "expiring.refund", 0)
			e.expire(t, o)
			if _, err := e.reconcileAs(t, "found-nothing", FindingNotApplied); err != nil {
				t.Fatal(err)
			}
			if done := e.settle(t, "found-nothing", o.FencingToken, OutcomeSucceeded, "R-1"); done.State != StateSucceeded {
				t.Fatalf("Complete from PENDING = %+v", done)
			}
			if res := e.reserveAs(t, "found-nothing", "expiring.refund", 0, "h-2"); res.Decision != DecisionReplay {
				t.Fatalf("decision = %v, want REPLAY", res.Decision)
			}
		})

		t.Run("from UNKNOWN, an earlier attempt's token", func(t *testing.T) {
			first := e.claim(t, "unknown-stale", "payments.refund", 0)
			e.settle(t, "unknown-stale", first.FencingToken, OutcomeFailedRetryable, "503")
			second := e.claim(t, "unknown-stale", "payments.refund", 0)
			e.unknown(t, "unknown-stale", second.FencingToken)
			before := e.lookup(t, "unknown-stale")
			_, err := e.complete(t, "unknown-stale", first.FencingToken, OutcomeSucceeded, &Result{ResourceID: "R-stale"}, nil)
			if le := wantKind(t, err, KindStaleToken); le.State != StateUnknown {
				t.Fatalf("state %v", le.State)
			}
			e.wantUnchanged(t, "unknown-stale", before)
		})

		t.Run("stale token on RUNNING", func(t *testing.T) {
			o := e.claim(t, "running-stale", "payments.refund", 0)
			before := e.lookup(t, "running-stale")
			for _, tok := range []uint64{o.FencingToken - 1, o.FencingToken + 1} {
				_, err := e.complete(t, "running-stale", tok, OutcomeSucceeded, nil, nil)
				if le := wantKind(t, err, KindStaleToken); le.State != StateRunning {
					t.Fatalf("state %v", le.State)
				}
			}
			e.wantUnchanged(t, "running-stale", before)
		})

		t.Run("stale token on a terminal record", func(t *testing.T) { // S11
			first := e.claim(t, "terminal-stale", "idempotent.sync", 0)
			e.settle(t, "terminal-stale", first.FencingToken, OutcomeFailedRetryable, "503")
			second := e.claim(t, "terminal-stale", "idempotent.sync", 0)
			e.settle(t, "terminal-stale", second.FencingToken, OutcomeSucceeded, "second")
			before := e.lookup(t, "terminal-stale")
			_, err := e.complete(t, "terminal-stale", first.FencingToken, OutcomeSucceeded, &Result{ResourceID: "first"}, nil)
			if le := wantKind(t, err, KindStaleToken); le.State != StateSucceeded {
				t.Fatalf("state %v", le.State)
			}
			e.wantUnchanged(t, "terminal-stale", before)
		})

		for _, from := range []State{StateRunning, StateUnknown} {
			t.Run("retryable failure from "+from.String(), func(t *testing.T) {
				id := "retryable-" + from.String()
				o := e.claim(t, id, "payments.refund", 0)
				if from == StateUnknown {
					e.unknown(t, id, o.FencingToken)
				}
				done := e.settle(t, id, o.FencingToken, OutcomeFailedRetryable, "503")
				if done.State != StatePending || done.Failure.Code != "503" || !done.LeaseExpiresAt.IsZero() || !done.UnknownSince.IsZero() {
					t.Fatalf("Complete(FAILED_RETRYABLE) = %+v, want PENDING", done)
				}
				if h := e.lastEntry(t, id); h.Reason != "FAILED_RETRYABLE" || h.From != from || h.To != StatePending {
					t.Fatalf("history = %+v", h)
				}
				res := e.reserveAs(t, id, "payments.refund", 0, "h-2")
				if res.Decision != DecisionExecute || res.Operation.Attempt != 2 {
					t.Fatalf("Reserve after the retryable failure = %+v", res)
				}
			})
		}

		// The same token and outcome again succeeds and changes nothing;
		// another outcome, or the same kind with another result or
		// failure, is a completion conflict.
		for _, tc := range []struct {
			first     Outcome
			firstArg  string
			other     Outcome
			otherArg  string
			wantState State
		}{
			{OutcomeSucceeded, "R-1", OutcomeFailedFinal, "declined", StateSucceeded},
			{OutcomeSucceeded, "R-1", OutcomeFailedRetryable, "503", StateSucceeded},
			{OutcomeSucceeded, "R-1", OutcomeSucceeded, "R-2", StateSucceeded},
			{OutcomeFailedFinal, "declined", OutcomeSucceeded, "R-1", StateFailedFinal},
			{OutcomeFailedFinal, "declined", OutcomeFailedFinal, "other_code", StateFailedFinal},
			{OutcomeFailedRetryable, "503", OutcomeSucceeded, "R-1", StatePending},
			{OutcomeFailedRetryable, "503", OutcomeFailedFinal, "declined", StatePending},
		} {
			id := outcomeNames[tc.first] + " then " + outcomeNames[tc.other] + " " + tc.otherArg
			t.Run(id, func(t *testing.T) {
				o := e.claim(t, id, "payments.refund", 0)
				e.settle(t, id, o.FencingToken, tc.first, tc.firstArg)
				before := e.lookup(t, id)
				if again := e.settle(t, id, o.FencingToken, tc.first, tc.firstArg); again.State != tc.wantState {
					t.Fatalf("the repeat = %+v", again)
				}
				e.wantUnchanged(t, id, before)
				r, f := outcome(tc.other, tc.otherArg)
				_, err := e.complete(t, id, o.FencingToken, tc.other, r, f)
				if le := wantKind(t, err, KindCompletionConflict); le.State != tc.wantState {
					t.Fatalf("state %v", le.State)
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
			o := e.claim(t, "running", "payments.refund", 0)
			u := e.unknown(t, "running", o.FencingToken)
			if u.State != StateUnknown || u.UnknownSince.IsZero() || !u.LeaseExpiresAt.IsZero() || u.Attempt != 1 {
				t.Fatalf("MarkUnknown = %+v", u)
			}
			if h := e.lastEntry(t, "running"); h.Reason != "MARKED_UNKNOWN" || h.Detail != "timeout" || h.From != StateRunning || h.To != StateUnknown {
				t.Fatalf("history = %+v", h)
			}
			if inLeaseIndex(e, "running") {
				t.Fatal("UNKNOWN operation still in the lease index")
			}
			before := e.lookup(t, "running")
			if again := e.unknown(t, "running", o.FencingToken); again.State != StateUnknown {
				t.Fatalf("the repeat = %+v", again)
			}
			e.wantUnchanged(t, "running", before)
		})

		refused := []struct {
			name  string
			setup func(id string) uint64
			kind  Kind
			state State
		}{
			{"stale token", func(id string) uint64 {
				first := e.claim(t, id, "payments.refund", 0)
				e.settle(t, id, first.FencingToken, OutcomeFailedRetryable, "503")
				e.claim(t, id, "payments.refund", 0)
				return first.FencingToken
			}, KindStaleToken, StateRunning},
			{"stale token on a terminal record", func(id string) uint64 {
				first := e.claim(t, id, "payments.refund", 0)
				e.settle(t, id, first.FencingToken, OutcomeFailedRetryable, "503")
				e.settle(t, id, e.claim(t, id, "payments.refund", 0).FencingToken, OutcomeSucceeded, "R-2")
				return first.FencingToken
			}, KindStaleToken, StateSucceeded},
			// The attempt already reported a retryable failure: it cannot
			// also not know.
			{"PENDING by this attempt's retryable failure", func(id string) uint64 {
				o := e.claim(t, id, "payments.refund", 0)
				e.settle(t, id, o.FencingToken, OutcomeFailedRetryable, "503")
				return o.FencingToken
			}, KindCompletionConflict, StatePending},
		}
		for _, tc := range refused {
			t.Run(tc.name, func(t *testing.T) {
				tok := tc.setup(tc.name)
				before := e.lookup(t, tc.name)
				_, err := e.markUnknown(t, tc.name, tok)
				if le := wantKind(t, err, tc.kind); le.State != tc.state {
					t.Fatalf("state %v, want %v", le.State, tc.state)
				}
				e.wantUnchanged(t, tc.name, before)
			})
		}

		// The lease ran out, a reconciler found nothing, then the worker,
		// whose token is still the latest, says it cannot tell: its
		// request may have reached the destination after the check.
		t.Run("PENDING by a finding, then the latest attempt's report", func(t *testing.T) {
			o := e.claim(t, "pending-found", "expiring.refund", 0)
			e.expire(t, o)
			if _, err := e.reconcileAs(t, "pending-found", FindingNotApplied); err != nil {
				t.Fatal(err)
			}
			u := e.unknown(t, "pending-found", o.FencingToken)
			if u.State != StateUnknown || u.Attempt != 1 || u.UnknownSince.IsZero() {
				t.Fatalf("MarkUnknown = %+v", u)
			}
			if h := e.lastEntry(t, "pending-found"); h.Reason != "MARKED_UNKNOWN" || h.From != StatePending || h.To != StateUnknown {
				t.Fatalf("history = %+v", h)
			}
			if res := e.reserveAs(t, "pending-found", "expiring.refund", 0, "h-2"); res.Decision != DecisionReconcile {
				t.Fatalf("Reserve after = %v, want RECONCILE", res.Decision)
			}
		})

		// Terminal by the worker's own Complete, and by a reconciler's
		// finding after the lease ran out: the worker's late MarkUnknown
		// leaves the outcome as recorded.
		terminal := []struct {
			name  string
			setup func(id string) uint64
			want  State
		}{
			{"SUCCEEDED by Complete", func(id string) uint64 {
				o := e.claim(t, id, "payments.refund", 0)
				e.settle(t, id, o.FencingToken, OutcomeSucceeded, "R-1")
				return o.FencingToken
			}, StateSucceeded},
			{"FAILED_FINAL by Complete", func(id string) uint64 {
				o := e.claim(t, id, "payments.refund", 0)
				e.settle(t, id, o.FencingToken, OutcomeFailedFinal, "declined")
				return o.FencingToken
			}, StateFailedFinal},
			{"SUCCEEDED by Reconcile", func(id string) uint64 {
				o := e.claim(t, id, "expiring.refund", 0)
				e.expire(t, o)
				if _, err := e.reconcileAs(t, id, FindingApplied); err != nil {
					t.Fatal(err)
				}
				return o.FencingToken
			}, StateSucceeded},
			{"FAILED_FINAL by Reconcile", func(id string) uint64 {
				o := e.claim(t, id, "expiring.refund", 0)
				e.expire(t, o)
				if _, err := e.reconcileAs(t, id, FindingAbandon); err != nil {
					t.Fatal(err)
				}
				return o.FencingToken
			}, StateFailedFinal},
		}
		for _, tc := range terminal {
			t.Run(tc.name, func(t *testing.T) {
				tok := tc.setup(tc.name)
				before := e.lookup(t, tc.name)
				if u := e.unknown(t, tc.name, tok); u.State != tc.want {
					t.Fatalf("MarkUnknown on %v = %+v", tc.want, u)
				}
				e.wantUnchanged(t, tc.name, before)
			})
		}
	})
}

// TestRenewRules: Renew extends a live claim with the current token only.
func TestRenewRules(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		t.Run("current token", func(t *testing.T) {
			o := e.claim(t, "live", "payments.refund", 0)
			time.Sleep(10 * time.Millisecond) // the store's clock moves on
			r, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "live", FencingToken: o.FencingToken})
			if err != nil {
				t.Fatal(err)
			}
			if r.State != StateRunning || !r.LeaseExpiresAt.After(o.LeaseExpiresAt) || r.FencingToken != o.FencingToken || r.Attempt != 1 {
				t.Fatalf("Renew = %+v, want the lease moved past %v", r, o.LeaseExpiresAt)
			}
			if got := e.lookup(t, "live"); !got.LeaseExpiresAt.Equal(r.LeaseExpiresAt) || len(got.History) != 1 {
				t.Fatalf("record after Renew = %+v", got)
			}
			k := e.opKeys("live")
			if s, _ := e.rdb.ZScore(e.ctx, k.all[2], k.member).Result(); int64(s) != r.LeaseExpiresAt.UnixMilli() {
				t.Fatalf("lease index at %v, want %d", s, r.LeaseExpiresAt.UnixMilli())
			}
		})

		refused := []struct {
			name  string
			setup func(id string) uint64
			state State
		}{
			{"earlier token", func(id string) uint64 {
				first := e.claim(t, id, "payments.refund", 0)
				e.settle(t, id, first.FencingToken, OutcomeFailedRetryable, "503")
				e.claim(t, id, "payments.refund", 0)
				return first.FencingToken
			}, StateRunning},
			{"later token", func(id string) uint64 {
				return e.claim(t, id, "payments.refund", 0).FencingToken + 1
			}, StateRunning},
			{"after Complete", func(id string) uint64 {
				o := e.claim(t, id, "payments.refund", 0)
				e.settle(t, id, o.FencingToken, OutcomeSucceeded, "R-1")
				return o.FencingToken
			}, StateSucceeded},
			{"after MarkUnknown", func(id string) uint64 {
				o := e.claim(t, id, "payments.refund", 0)
				e.unknown(t, id, o.FencingToken)
				return o.FencingToken
			}, StateUnknown},
			{"after a retryable failure", func(id string) uint64 {
				o := e.claim(t, id, "payments.refund", 0)
				e.settle(t, id, o.FencingToken, OutcomeFailedRetryable, "503")
				return o.FencingToken
			}, StatePending},
		}
		for _, tc := range refused {
			t.Run(tc.name, func(t *testing.T) {
				tok := tc.setup(tc.name)
				before := e.lookup(t, tc.name)
				_, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: tc.name, FencingToken: tok})
				if le := wantKind(t, err, KindStaleToken); le.State != tc.state {
					t.Fatalf("state %v, want %v", le.State, tc.state)
				}
				e.wantUnchanged(t, tc.name, before)
			})
		}

		// Past the lease Renew is too late: it records the expiry itself.
		t.Run("past the lease", func(t *testing.T) {
			o := e.claim(t, "lapsed", "expiring.refund", 0)
			e.waitLeaseEnd(t, o)
			_, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "lapsed", FencingToken: o.FencingToken})
			if le := wantKind(t, err, KindStaleToken); le.State != StateUnknown {
				t.Fatalf("state %v, want UNKNOWN", le.State)
			}
			if h := e.lastEntry(t, "lapsed"); h.Reason != "LEASE_EXPIRED" || h.From != StateRunning || h.To != StateUnknown {
				t.Fatalf("history = %+v", h)
			}
		})
	})
}

// TestHistoryOfEveryTransition: every transition is in Lookup's history
// with its time, from and to states, attempt, token, principal and reason,
// oldest first.
func TestHistoryOfEveryTransition(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		first := e.claim(t, "refund", "payments.refund", 0)
		e.settle(t, "refund", first.FencingToken, OutcomeFailedRetryable, "503")
		second := e.claim(t, "refund", "payments.refund", 0)
		e.unknown(t, "refund", second.FencingToken)
		for _, f := range []Finding{FindingEscalate, FindingApplied} {
			if _, err := e.reconcileAs(t, "refund", f); err != nil {
				t.Fatal(err)
			}
		}
		o := e.lookup(t, "refund")
		want := []HistoryEntry{
			{From: StateUnspecified, To: StateRunning, Attempt: 1, FencingToken: first.FencingToken, Reason: "RESERVED"},
			{From: StateRunning, To: StatePending, Attempt: 1, FencingToken: first.FencingToken, Reason: "FAILED_RETRYABLE"},
			{From: StatePending, To: StateRunning, Attempt: 2, FencingToken: second.FencingToken, Reason: "CLAIMED"},
			{From: StateRunning, To: StateUnknown, Attempt: 2, FencingToken: second.FencingToken, Reason: "MARKED_UNKNOWN", Detail: "timeout"},
			{From: StateUnknown, To: StateUnknown, Attempt: 2, FencingToken: second.FencingToken, Reason: "ESCALATED", Detail: "checked the destination"},
			{From: StateUnknown, To: StateSucceeded, Attempt: 2, FencingToken: second.FencingToken, Reason: "RECONCILED_APPLIED", Detail: "checked the destination"},
		}
		if len(o.History) != len(want) {
			t.Fatalf("history has %d entries, want %d: %+v", len(o.History), len(want), o.History)
		}
		prev := o.CreatedAt
		for i, w := range want {
			h := o.History[i]
			if h.Time.Before(prev) {
				t.Errorf("entry %d at %v, before the previous entry or the creation (%v)", i, h.Time, prev)
			}
			prev, w.Time, w.Principal = h.Time, h.Time, "agent-1"
			if h != w {
				t.Errorf("entry %d = %+v, want %+v", i, h, w)
			}
		}
		if !o.UpdatedAt.Equal(prev) {
			t.Errorf("updated_at %v, the latest entry at %v", o.UpdatedAt, prev)
		}
	})
}

var outcomeNames = map[Outcome]string{OutcomeSucceeded: "SUCCEEDED", OutcomeFailedFinal: "FAILED_FINAL", OutcomeFailedRetryable: "FAILED_RETRYABLE"}

// TestIrreversiblePastLease: an irreversible claim past its lease that no
// sweep has moved is still RUNNING. Reserve makes it UNKNOWN
// (LEASE_EXPIRED) and answers RECONCILE, to the same holder too; Complete
// and MarkUnknown with its token are accepted, Renew is refused; Reconcile
// accepts every finding on it.
func TestIrreversiblePastLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// pastLease claims id for tool and waits past its lease, with no
		// sweep meanwhile; then runs f.
		pastLease := func(t *testing.T, id, tool string, f func(o *Operation)) {
			t.Helper()
			o := e.reserveAs(t, id, tool, 0, "h-1").Operation
			unswept(func() {
				e.waitLeaseEnd(t, o)
				if got := e.lookup(t, id); got.State != StateRunning {
					t.Fatalf("state %v past the lease, want RUNNING (nothing sweeps)", got.State)
				}
				f(o)
			})
		}
		t.Run("Reserve", func(t *testing.T) {
			pastLease(t, "reserve", "expiring.refund", func(first *Operation) {
				res := e.reserveAs(t, "reserve", "expiring.refund", 0, "h-1")
				if o := res.Operation; res.Decision != DecisionReconcile || o.State != StateUnknown || o.Reason != "LEASE_EXPIRED" ||
					o.Attempt != 1 || o.FencingToken != first.FencingToken {
					t.Fatalf("Reserve after the lease = %+v, want RECONCILE, UNKNOWN (LEASE_EXPIRED)", res)
				}
			})
			if h := e.lastEntry(t, "reserve"); h.Reason != "LEASE_EXPIRED" || h.From != StateRunning || h.To != StateUnknown {
				t.Fatalf("history = %+v", h)
			}
		})

		// The lease is not checked by Complete and MarkUnknown: the worker
		// whose token is still the current one reports what happened.
		t.Run("Complete", func(t *testing.T) {
			pastLease(t, "complete", "expiring.refund", func(o *Operation) {
				if done := e.settle(t, "complete", o.FencingToken, OutcomeSucceeded, "R-1"); done.State != StateSucceeded {
					t.Fatalf("Complete past the lease = %+v", done)
				}
			})
			if h := e.lastEntry(t, "complete"); h.From != StateRunning {
				t.Fatalf("history = %+v", h)
			}
		})
		t.Run("MarkUnknown", func(t *testing.T) {
			pastLease(t, "mark", "expiring.refund", func(o *Operation) {
				if u := e.unknown(t, "mark", o.FencingToken); u.State != StateUnknown || u.Reason != "MARKED_UNKNOWN" {
					t.Fatalf("MarkUnknown past the lease = %+v", u)
				}
			})
		})

		// Renew cannot bring an ended lease back (design.md, 3.4 rule 7):
		// an irreversible operation becomes UNKNOWN, as the sweeper would
		// make it; an idempotent one is left for a Reserve to reclaim.
		for _, tc := range []struct {
			tool   string
			state  State
			reason string
		}{{"expiring.refund", StateUnknown, "LEASE_EXPIRED"}, {"expiring.idempotent", StateRunning, "RESERVED"}} {
			t.Run("Renew "+tc.tool, func(t *testing.T) {
				id := "renew-" + tc.tool
				pastLease(t, id, tc.tool, func(o *Operation) {
					_, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: id, FencingToken: o.FencingToken})
					if le := wantKind(t, err, KindStaleToken); le.State != tc.state {
						t.Fatalf("state %v, want %v", le.State, tc.state)
					}
					got := e.lookup(t, id)
					if got.State != tc.state || got.Reason != tc.reason {
						t.Fatalf("after Renew past the lease: %+v", got)
					}
					if tc.state == StateRunning && !got.LeaseExpiresAt.Equal(o.LeaseExpiresAt) {
						t.Fatalf("Renew past the lease moved it to %v", got.LeaseExpiresAt)
					}
				})
			})
		}

		want := map[Finding]State{FindingApplied: StateSucceeded, FindingNotApplied: StatePending,
			FindingAbandon: StateFailedFinal, FindingEscalate: StateUnknown}
		for f, st := range want {
			id := "reconcile-" + st.String()
			t.Run("Reconcile to "+st.String(), func(t *testing.T) {
				pastLease(t, id, "expiring.refund", func(*Operation) {
					o, err := e.reconcileAs(t, id, f)
					if err != nil {
						t.Fatalf("Reconcile(%v) of a RUNNING operation past its lease: %v", f, err)
					}
					if h := o.History[len(o.History)-1]; o.State != st || h.From != StateRunning || h.To != st || !o.LeaseExpiresAt.IsZero() ||
						o.NeedsReview != (f == FindingEscalate) {
						t.Fatalf("Reconcile(%v) = %+v, want %v from RUNNING", f, o, st)
					}
				})
			})
		}
	})
}
