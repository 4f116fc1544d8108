package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// compactor returns a compactor of e's ledger that walks only the records of
// e's tenant: the "redis" and "cluster" runs share their servers with other
// tests, whose records past their retention (TestTombstone reads one
// byte for byte) are not this test's to compact.
func (e *env) compactor(batch int) *Compactor {
	c := e.l.NewCompactor(batch)
	c.match = e.l.keys.prefix + ":{s[0-9][0-9]}:op:" + encodeComponent(e.who.Tenant) + ":*"
	return c
}

// answers are the answers of every call about id (with token tok) that
// must not change when the record is compacted, each as a comparable
// string; a call that returns an operation says so (it must not, for an
// expired one). A Reserve that decides EXECUTE counts one more effect.
func (e *env) answers(t *testing.T, id string, tok uint64, applied *int) []string {
	t.Helper()
	say := func(what string, o any, err error) string {
		var ee *Error
		switch {
		case errors.As(err, &ee):
			return fmt.Sprintf("%s: %v state %v, operation %v", what, ee.Kind, ee.State, ee.Operation != nil)
		case err != nil:
			t.Fatalf("%s(%s): %v", what, id, err)
		}
		return fmt.Sprintf("%s: ok %+v", what, o)
	}
	var out []string
	res, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: id, Tool: "compact.refund", Params: map[string]any{"amount": 10.0}, PermitID: "permit-1", Holder: "late"})
	if err == nil && res.Decision == DecisionExecute {
		*applied++
	}
	out = append(out, say("Reserve", res, err))
	// Other parameters, tool and permit under the key: the key reused (the
	// tombstone keeps the fingerprint), before compaction as after.
	res, err = e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: id, Tool: "compact.other", Params: map[string]any{"amount": 11.0}, PermitID: "permit-2", Holder: "late"})
	if err == nil && res.Decision == DecisionExecute {
		*applied++
	}
	out = append(out, say("Reserve changed", res, err))
	o, err := e.l.Lookup(e.ctx, e.who, id)
	out = append(out, say("Lookup", o, err))
	o, err = e.complete(t, id, tok, OutcomeSucceeded, &Result{ResourceID: "late"}, nil)
	out = append(out, say("Complete", o, err))
	o, err = e.complete(t, id, tok, OutcomeFailedRetryable, nil, &Failure{Code: "late"})
	out = append(out, say("Complete retryable", o, err))
	o, err = e.markUnknown(t, id, tok)
	out = append(out, say("MarkUnknown", o, err))
	o, err = e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: id, FencingToken: tok})
	out = append(out, say("Renew", o, err))
	o, err = e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingApplied, Result: &Result{ResourceID: "late"}})
	out = append(out, say("Reconcile applied", o, err))
	o, err = e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingNotApplied, Note: "late"})
	out = append(out, say("Reconcile not applied", o, err))
	return out
}

// refusedAsExpired reports whether an answer of answers is the refusal of
// an expired operation that ended in state: IDEMPOTENCY_KEY_EXPIRED, or
// IDEMPOTENCY_KEY_REUSED for the Reserve with other parameters.
func refusedAsExpired(answer, state string) bool {
	if strings.HasPrefix(answer, "Reserve changed: ") {
		return answer == "Reserve changed: idempotency key reused state UNSPECIFIED, operation false"
	}
	return strings.HasSuffix(answer, ": idempotency key expired state "+state+", operation false")
}

// stored is a key's value and remaining TTL, read in one round trip.
func (e *env) stored(t *testing.T, key string) (string, time.Duration) {
	t.Helper()
	pipe := e.rdb.Pipeline()
	get := pipe.Get(e.ctx, key)
	ttl := pipe.PTTL(e.ctx, key)
	if _, err := pipe.Exec(e.ctx); err != nil {
		t.Fatalf("GET/PTTL %s: %v", key, err)
	}
	return get.Val(), ttl.Val()
}

// tombstoneOf is what compaction leaves of a stored record: its
// fingerprint, its first four fields (st, exp, ct, ut; an empty exp written
// out as the retention), an empty attempt,
// the consequential fields (cf, the 30th field) and the head of its
// history chain. A tombstone is its own.
func tombstoneOf(s string) string {
	body, _, _ := strings.Cut(s[33:], "\xfe")
	f := strings.Split(body, "\xff")
	if len(f) < 5 || f[4] == "" {
		return s
	}
	cf := ""
	if len(f) >= 30 {
		cf = f[29]
	}
	o, _, err := decodeRecord(s)
	if err != nil {
		return s
	}
	_, head := o.Chain()
	if f[1] == "" && len(f) >= 12 {
		f[1] = f[11] // the retention after ut
	}
	return s[:33] + strings.Join(f[:4], "\xff") + "\xff\xff" + cf + "\xff" + head
}

// lookupState is the final state Lookup reports for an expired id.
func (e *env) lookupState(id string) string {
	_, err := e.l.Lookup(e.ctx, e.who, id)
	var ee *Error
	if !errors.As(err, &ee) {
		return "none"
	}
	return ee.State.String()
}

// waitExpired waits until Lookup reports every id as expired.
func (e *env) waitExpired(t *testing.T, ids ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, id := range ids {
		for {
			_, err := e.l.Lookup(e.ctx, e.who, id)
			var ee *Error
			if errors.As(err, &ee) && ee.Kind == KindKeyExpired {
				break
			}
			if err != nil && !errors.As(err, &ee) {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never expired", id)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestCompaction: at the end of a terminal record's retention, a pass cuts
// it to its tombstone: the result, the failure, the notes and the history
// are gone from the store, the key ends when it did, and every call answers
// as it did before (a late Reserve is refused, never executed). Records in
// their retention, non-terminal ones and other keys are left byte for byte.
func TestCompaction(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		secrets := []string{"customer-data-4711", "res-4711", "declined-for-customer-4711", "note-4711", "timeout"}
		tokens := map[string]uint64{}

		// Succeeded with a result.
		o := e.execute(t, "ok", "compact.refund")
		tokens["ok"] = o.FencingToken
		if _, err := e.complete(t, "ok", o.FencingToken, OutcomeSucceeded, &Result{Data: []byte(`{"card":"customer-data-4711"}`), ResourceID: "res-4711"}, nil); err != nil {
			t.Fatal(err)
		}
		// Failed with a message.
		o = e.execute(t, "failed", "compact.refund")
		tokens["failed"] = o.FencingToken
		if _, err := e.complete(t, "failed", o.FencingToken, OutcomeFailedFinal, nil, &Failure{Code: "declined", Message: "declined-for-customer-4711"}); err != nil {
			t.Fatal(err)
		}
		// Reported UNKNOWN, then resolved by a reconciler with a note.
		o = e.execute(t, "reconciled", "compact.refund")
		tokens["reconciled"] = o.FencingToken
		if _, err := e.markUnknown(t, "reconciled", o.FencingToken); err != nil {
			t.Fatal(err)
		}
		if _, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: "reconciled", Finding: FindingAbandon,
			Failure: &Failure{Code: "gone", Message: "declined-for-customer-4711"}, Note: "note-4711"}); err != nil {
			t.Fatal(err)
		}
		expired := []string{"ok", "failed", "reconciled"}

		// Left alone: in its retention, running, a hash, and strings that
		// are no records.
		o = e.execute(t, "kept", "payments.refund")
		if _, err := e.complete(t, "kept", o.FencingToken, OutcomeSucceeded, &Result{Data: []byte(`{"card":"customer-data-4711"}`)}, nil); err != nil {
			t.Fatal(err)
		}
		e.execute(t, "running", "compact.refund")
		foreign := map[string]string{"st": "3", "exp": "1"}
		if err := e.rdb.HSet(e.ctx, e.opKeys("foreign").all[0], foreign).Err(); err != nil {
			t.Fatal(err)
		}
		other := map[string]string{
			e.opKeys("not-a-record").all[0]: "L and some text",
			e.opKeys("short").all[0]:        "3\xff1\xff",
			// A unit without a number where the update time goes: no
			// record, and the walk must not stop on it.
			e.opKeys("bare-unit").all[0]: "L" + strings.Repeat("f", 32) + "3\xff1d\xffk1\xffs\xff2\xff",
		}
		for k, v := range other {
			if err := e.rdb.Set(e.ctx, k, v, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		untouched := map[string]string{}
		for _, id := range []string{"kept", "running", "not-a-record", "short", "bare-unit"} {
			untouched[id], _ = e.stored(t, e.opKeys(id).all[0])
		}

		e.waitExpired(t, expired...)
		applied := 0
		before := map[string][]string{}
		values := map[string]string{}
		ttls := map[string]time.Duration{}
		for _, id := range expired {
			before[id] = e.answers(t, id, tokens[id], &applied)
			values[id], ttls[id] = e.stored(t, e.opKeys(id).all[0])
		}
		st, err := e.compactor(0).Pass(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Compacted != len(expired) || st.Examined < len(untouched)+len(expired)+1 {
			t.Fatalf("pass = %+v, want %d records compacted", st, len(expired))
		}
		for _, id := range expired {
			now, ttl := e.stored(t, e.opKeys(id).all[0])
			if now != tombstoneOf(values[id]) || len(now) >= len(values[id]) {
				t.Fatalf("%s compacted to %q, want %q", id, now, tombstoneOf(values[id]))
			}
			for _, s := range secrets {
				if strings.Contains(now, s) {
					t.Fatalf("%s still holds %q after compaction", id, s)
				}
			}
			if d := ttls[id] - ttl; d < 0 || d > 5*time.Second || ttl < 50*time.Minute {
				t.Fatalf("%s: TTL %v after compaction, %v before", id, ttl, ttls[id])
			}
			if got := e.answers(t, id, tokens[id], &applied); !slices.Equal(got, before[id]) {
				t.Fatalf("%s: answers after compaction\n%s\nbefore\n%s", id, strings.Join(got, "\n"), strings.Join(before[id], "\n"))
			}
			for _, a := range before[id] {
				if !refusedAsExpired(a, e.lookupState(id)) {
					t.Fatalf("%s: %s, want expired", id, a)
				}
			}
		}
		if applied != 0 {
			t.Fatalf("late Reserves executed %d times", applied)
		}
		check := func() {
			t.Helper()
			for id, v := range untouched {
				if now, _ := e.stored(t, e.opKeys(id).all[0]); now != v {
					t.Fatalf("%s changed by compaction: %q, was %q", id, now, v)
				}
			}
			now, err := e.rdb.HGetAll(e.ctx, e.opKeys("foreign").all[0]).Result()
			if err != nil || !maps.Equal(now, foreign) {
				t.Fatalf("a hash changed by compaction: %v (%v)", now, err)
			}
		}
		check()

		// A second pass changes nothing.
		compacted := map[string]string{}
		for _, id := range expired {
			compacted[id], _ = e.stored(t, e.opKeys(id).all[0])
		}
		if st, err := e.compactor(0).Pass(e.ctx); err != nil || st.Compacted != 0 {
			t.Fatalf("second pass = %+v, %v", st, err)
		}
		for _, id := range expired {
			if now, _ := e.stored(t, e.opKeys(id).all[0]); now != compacted[id] {
				t.Fatalf("%s changed by a second pass", id)
			}
		}
		check()
		if got := e.lookup(t, "kept"); string(got.Result.Data) != `{"card":"customer-data-4711"}` || len(got.History) != 2 {
			t.Fatalf("record in its retention = %+v", got)
		}
	})
}

// TestCompactionSteps: Step walks the keys a batch at a time, on every
// master of a cluster, and compacts every due record, each once.
func TestCompactionSteps(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		const n = 30 // spread over the shards, so over every master of a cluster
		var ids []string
		for i := range n {
			id := fmt.Sprintf("op-%d", i)
			o := e.execute(t, id, "compact.refund")
			if _, err := e.complete(t, id, o.FencingToken, OutcomeSucceeded, &Result{Data: []byte(`{"card":"customer-data-4711"}`)}, nil); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		e.waitExpired(t, ids...)
		const batch = 7
		c := e.compactor(batch)
		masters := 1
		if cc, ok := e.rdb.(*redis.ClusterClient); ok {
			shards, err := cc.ClusterShards(e.ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			masters = len(shards)
		}
		// A master with fewer keys ends its pass sooner and starts another,
		// so the passes counted do not say that each master ended one: walk
		// until every record is compacted and at least one pass per master.
		total, passes := 0, 0
		for steps := 0; passes < masters || total < n; steps++ {
			if steps > 100000 {
				t.Fatalf("no pass after %d steps (%d compacted)", steps, total)
			}
			st, err := c.Step(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Examined > batch*masters {
				t.Fatalf("a step examined %d keys, want at most %d per master", st.Examined, batch)
			}
			total += st.Compacted
			passes += st.Passes
		}
		if total != n {
			t.Fatalf("steps compacted %d records, want %d", total, n)
		}
		// Every master held some of them, and holds no body any more.
		seen := 0
		var mu sync.Mutex
		per := func(ctx context.Context, c redis.Cmdable) error {
			keys, err := c.Keys(ctx, e.l.keys.prefix+":*:op:"+encodeComponent(e.who.Tenant)+":*").Result()
			if err != nil {
				return err
			}
			for _, k := range keys {
				v, err := c.Get(ctx, k).Result()
				if err != nil {
					return err
				}
				if strings.Contains(v, "customer-data") || v[33] != '3' || v != tombstoneOf(v) {
					return fmt.Errorf("%s not compacted: %q", k, v)
				}
			}
			mu.Lock()
			if len(keys) > 0 {
				seen++
			}
			mu.Unlock()
			return nil
		}
		var err error
		if cc, ok := e.rdb.(*redis.ClusterClient); ok {
			err = cc.ForEachMaster(e.ctx, func(ctx context.Context, c *redis.Client) error { return per(ctx, c) })
		} else {
			err = per(e.ctx, e.rdb)
		}
		if err != nil || seen != masters {
			t.Fatalf("records on %d of %d masters (%v)", seen, masters, err)
		}
	})
}

// TestCompactedTombstoneIsExpired: a compacted tombstone is expired whatever
// the store's clock says (a clock set back after the compaction must not
// bring a record without its body back to life).
func TestCompactedTombstoneIsExpired(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "payments.refund")
		if _, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil); err != nil {
			t.Fatal(err)
		}
		k := e.opKeys("op").all[0]
		v, ttl := e.stored(t, k)
		// The tombstone as the compaction writes it, of a record whose
		// retention (7 days) has not ended by this clock.
		if err := e.rdb.Set(e.ctx, k, tombstoneOf(v), ttl).Err(); err != nil {
			t.Fatal(err)
		}
		applied := 0
		for _, a := range e.answers(t, "op", o.FencingToken, &applied) {
			if !refusedAsExpired(a, "SUCCEEDED") {
				t.Fatalf("on a compacted tombstone: %s", a)
			}
		}
		if applied != 0 {
			t.Fatal("a late Reserve executed")
		}
		if now, _ := e.stored(t, k); now != tombstoneOf(v) {
			t.Fatal("a call changed the tombstone")
		}
		// And the compaction leaves it as it is.
		if st, err := e.compactor(0).Pass(e.ctx); err != nil || st.Compacted != 0 {
			t.Fatalf("pass = %+v, %v", st, err)
		}
		if now, _ := e.stored(t, k); !bytes.Equal([]byte(now), []byte(tombstoneOf(v))) {
			t.Fatal("the pass changed the tombstone")
		}
	})
}

// clusterMasters returns the addresses of the cluster's masters.
func clusterMasters(t *testing.T, e *env, cc *redis.ClusterClient) []string {
	t.Helper()
	var (
		mu    sync.Mutex
		addrs []string
	)
	err := cc.ForEachMaster(e.ctx, func(ctx context.Context, n *redis.Client) error {
		mu.Lock()
		addrs = append(addrs, n.Options().Addr)
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

// TestCompactionScriptMissing: a pass on a Redis that lost the ledger's
// library and scripts (FUNCTION FLUSH, SCRIPT FLUSH) sends them again and
// compacts every due record: by FCALL, or by EVAL where Functions are off;
// never the other way.
func TestCompactionScriptMissing(t *testing.T) {
	pol, err := ParsePolicies([]byte(ledgertest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		noFunctions bool
		want, never string // the commands that ran the pass, and one that must not
	}{
		{"functions", false, "fcall", "eval"},
		{"evalsha", true, "eval", "fcall"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			l, err := New(rdb, Options{Policies: pol, NoFunctions: tc.noFunctions})
			if err != nil {
				t.Fatal(err)
			}
			e := &env{l: l, lrdb: rdb, rdb: rdb, who: Principal{Tenant: "t-" + randomHex(6), ID: "agent-1"}, ctx: context.Background()}
			ids := []string{"a", "b", "c"}
			for _, id := range ids {
				o := e.execute(t, id, "compact.refund")
				if _, err := e.complete(t, id, o.FencingToken, OutcomeSucceeded, &Result{Data: []byte(`{"n":1}`)}, nil); err != nil {
					t.Fatal(err)
				}
			}
			e.waitExpired(t, ids...)
			if err := rdb.FunctionFlush(e.ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.ScriptFlush(e.ctx).Err(); err != nil {
				t.Fatal(err)
			}
			want, never := commandCalls(t, rdb, tc.want), commandCalls(t, rdb, tc.never)
			st, err := e.compactor(0).Pass(e.ctx)
			if err != nil || st.Compacted != len(ids) {
				t.Fatalf("pass = %+v, %v; want %d compacted", st, err, len(ids))
			}
			if n := commandCalls(t, rdb, tc.want) - want; n < len(ids) {
				t.Errorf("Redis ran %d %s for the pass, want at least %d", n, tc.want, len(ids))
			}
			if n := commandCalls(t, rdb, tc.never) - never; n != 0 {
				t.Errorf("Redis ran %d %s for the pass, want none", n, tc.never)
			}
		})
	}
}

// TestCompactionKeyMovedAway: a key that one master's SCAN returned and
// whose slot then moved to another master (a resharding, or a master
// removed or failed over while its walk held keys) is answered MOVED or ASK
// by the node the walk runs on. The walk goes on without it (the new
// master's walk finds it) instead of trying the same batch again at every
// step and never reaching the end of that master's keys.
func TestCompactionKeyMovedAway(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		cc, ok := e.rdb.(*redis.ClusterClient)
		if !ok {
			t.Skip("Redis Cluster only")
		}
		o := e.execute(t, "moved", "compact.refund")
		if _, err := e.complete(t, "moved", o.FencingToken, OutcomeSucceeded, &Result{Data: []byte(`{"card":"customer-data-4711"}`)}, nil); err != nil {
			t.Fatal(err)
		}
		e.waitExpired(t, "moved")
		k := e.opKeys("moved").all[0]
		owner, err := cc.MasterForKey(e.ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		c := e.compactor(100)
		// The walk of another master holds the key, as when its slot moved
		// after that master's SCAN returned it.
		for _, addr := range clusterMasters(t, e, cc) {
			if addr != owner.Options().Addr {
				c.walks[addr] = &walk{pending: []string{k}}
				break
			}
		}
		for steps := 0; ; steps++ {
			if steps > 10000 {
				t.Fatalf("%s not compacted after %d steps", k, steps)
			}
			if _, err := c.Step(e.ctx); err != nil {
				t.Fatalf("step %d: %v", steps, err)
			}
			if v, _ := e.stored(t, k); v == tombstoneOf(v) {
				break
			}
		}
		for addr, w := range c.walks {
			if slices.Contains(w.pending, k) {
				t.Fatalf("the walk of %s still holds %s", addr, k)
			}
		}
	})
}

// TestCompactionForgetsGoneMasters: the walk of an address that is no
// master any more (failed over, removed) is dropped at the next Step, so
// the compactor keeps no position for nodes it no longer walks.
func TestCompactionForgetsGoneMasters(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		cc, ok := e.rdb.(*redis.ClusterClient)
		if !ok {
			t.Skip("Redis Cluster only")
		}
		c := e.compactor(10)
		c.walks["127.0.0.1:1"] = &walk{cursor: 42, pending: []string{"ledger:{s00}:op:gone:gone"}}
		if _, err := c.Step(e.ctx); err != nil {
			t.Fatal(err)
		}
		masters := clusterMasters(t, e, cc)
		slices.Sort(masters)
		if got := slices.Sorted(maps.Keys(c.walks)); !slices.Equal(got, masters) {
			t.Fatalf("walks of %v, want those of the masters %v", got, masters)
		}
	})
}

// TestCompactionKeepsTheKeysEnd: the compacted key ends when the record's
// key did (the terminal transition's PX: retention plus tombstone
// retention), read as an absolute time (PEXPIRETIME), and a key without a
// TTL stays without one. Redis stores the end in milliseconds; Redis
// before 7.2 reads its clock again for SET's PX, which can only move the
// end later, and the embedded engine keeps TTLs below the millisecond,
// which PTTL truncates: so at most 1 ms earlier, never more.
func TestCompactionKeepsTheKeysEnd(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		for _, id := range []string{"ttl", "persisted"} {
			o := e.execute(t, id, "compact.refund")
			if _, err := e.complete(t, id, o.FencingToken, OutcomeSucceeded, &Result{Data: []byte(`{"card":"customer-data-4711"}`)}, nil); err != nil {
				t.Fatal(err)
			}
		}
		e.waitExpired(t, "ttl", "persisted")
		k, p := e.opKeys("ttl").all[0], e.opKeys("persisted").all[0]
		if err := e.rdb.Persist(e.ctx, p).Err(); err != nil {
			t.Fatal(err)
		}
		end := func(key string) int64 {
			t.Helper()
			v, err := e.rdb.Do(e.ctx, "PEXPIRETIME", key).Int64()
			if err != nil {
				t.Fatalf("PEXPIRETIME %s: %v", key, err)
			}
			return v
		}
		before := end(k)
		if before <= 0 || end(p) != -1 {
			t.Fatalf("before: ends %d and %d", before, end(p))
		}
		vk, _ := e.stored(t, k)
		vp, _ := e.stored(t, p)
		st, err := e.compactor(0).Pass(e.ctx)
		if err != nil || st.Compacted != 2 {
			t.Fatalf("pass = %+v, %v", st, err)
		}
		if now, _ := e.stored(t, k); now != tombstoneOf(vk) {
			t.Fatalf("%s compacted to %q", k, now)
		}
		if now, _ := e.stored(t, p); now != tombstoneOf(vp) {
			t.Fatalf("%s compacted to %q", p, now)
		}
		if after := end(k); after < before-1 || after > before+1000 {
			t.Fatalf("the key ends at %d after compaction, at %d before", after, before)
		}
		if after := end(p); after != -1 {
			t.Fatalf("a key without a TTL ends at %d after compaction", after)
		}
	})
}

// TestCompactionWalkFailureIsReported: a compaction step whose walk cannot
// read the keys (SCAN refused: a Redis user without +scan, the runbook's
// first case; or Redis unreachable) is reported as a failed store call of
// op "Compact", as a failed script of the pass is, so that
// ledger_store_errors_total{op="Compact"} and the LedgerCompactionFailing
// alert see it, not only the warn log.
func TestCompactionWalkFailureIsReported(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	srv.CreateUser(t, "noscan", "noscan-password", ACLRules(DefaultPrefix)+" -scan")
	observe, reported := compactFailures()
	l, err := New(srv.UserClient(t, "noscan", "noscan-password"), Options{Observer: observe})
	if err != nil {
		t.Fatal(err)
	}
	c := l.NewCompactor(0)
	if _, err := c.Step(ctx); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Step as a user without +scan: %v, want NOPERM", err)
	}
	if got := reported(); !slices.Equal(got, []Kind{KindOther}) {
		t.Fatalf("a SCAN refused (NOPERM) reported as failures of kinds %v, want one script error (%v)", got, KindOther)
	}

	srv.Stop()
	if _, err := c.Step(ctx); KindOf(err) != KindUnavailable {
		t.Fatalf("Step with Redis gone: %v (kind %v), want unavailable", err, KindOf(err))
	}
	if got := reported(); !slices.Equal(got, []Kind{KindOther, KindUnavailable}) {
		t.Fatalf("after a SCAN that reached no Redis, failures of kinds %v reported, want %v", got, []Kind{KindOther, KindUnavailable})
	}
}

// compactFailures returns an Observer that records the kinds of the failed
// store calls of op "Compact", and the function that reads them.
func compactFailures() (observe func(Event), reported func() []Kind) {
	var (
		mu     sync.Mutex
		failed []Kind
	)
	observe = func(e Event) {
		if e.Type == EventScript && e.Op == "Compact" && e.Failed {
			mu.Lock()
			failed = append(failed, e.ErrKind)
			mu.Unlock()
		}
	}
	reported = func() []Kind {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(failed)
	}
	return observe, reported
}

// TestCompactionMastersListFailureIsReported: in cluster mode, a compaction
// step that cannot list the masters to walk (CLUSTER SLOTS refused: a Redis
// user without +cluster|slots; or no node reachable) is reported as a
// failed store call of op "Compact", as a failed SCAN of the walk is
// (TestCompactionWalkFailureIsReported), unless the pass was stopped.
func TestCompactionMastersListFailureIsReported(t *testing.T) {
	cl := redistest.SharedCluster(t)
	ctx := context.Background()
	for _, s := range cl.Nodes {
		s.CreateUser(t, "noslots", "noslots-password", ACLRules(DefaultPrefix))
	}
	observe, reported := compactFailures()
	compactor := func(opts *redis.ClusterOptions) *Compactor {
		cc := redis.NewClusterClient(opts)
		t.Cleanup(func() { _ = cc.Close() })
		l, err := New(cc, Options{Observer: observe})
		if err != nil {
			t.Fatal(err)
		}
		return l.NewCompactor(0)
	}

	c := compactor(&redis.ClusterOptions{Addrs: cl.Addrs(), Username: "noslots", Password: "noslots-password", DisableIdentity: true})
	if _, err := c.Step(ctx); err == nil || !strings.Contains(err.Error(), "NOPERM") || KindOf(err) != KindOther {
		t.Fatalf("Step as a user without +cluster|slots: %v (kind %v), want NOPERM, a script error", err, KindOf(err))
	}
	if got := reported(); !slices.Equal(got, []Kind{KindOther}) {
		t.Fatalf("masters not listed (NOPERM) reported as failures of kinds %v, want one script error (%v)", got, KindOther)
	}
	if _, err := c.Pass(ctx); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Pass as a user without +cluster|slots: %v, want NOPERM", err)
	}
	if got := reported(); !slices.Equal(got, []Kind{KindOther, KindOther}) {
		t.Fatalf("after a Pass that listed no masters, failures of kinds %v reported, want %v", got, []Kind{KindOther, KindOther})
	}

	// A pass that was stopped is not a store failure.
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Step(stopped); err == nil {
		t.Fatal("Step with a cancelled context succeeded")
	}
	if got := reported(); len(got) != 2 {
		t.Fatalf("a stopped step was reported: failures of kinds %v", got)
	}

	// No node reachable: the seed is a port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	_ = ln.Close()
	c = compactor(&redis.ClusterOptions{Addrs: []string{gone}, DisableIdentity: true, MaxRetries: -1})
	if _, err := c.Step(ctx); KindOf(err) != KindUnavailable {
		t.Fatalf("Step with no node reachable: %v (kind %v), want unavailable", err, KindOf(err))
	}
	if got := reported(); !slices.Equal(got, []Kind{KindOther, KindOther, KindUnavailable}) {
		t.Fatalf("after a Step that reached no node, failures of kinds %v reported, want %v", got, []Kind{KindOther, KindOther, KindUnavailable})
	}
}

var (
	compactFuzzOnce sync.Once
	compactFuzzL    *Ledger
	compactFuzzRDB  *redis.Client
	compactFuzzSeed []string
	compactFuzzNow  time.Time // the store's clock, past the seeds' retention
)

// compactFuzzSetup starts one embedded store for the fuzzing process, with
// a ledger whose terminal records leave their retention after a second and
// a clock an hour ahead of them, and returns real stored records to start
// from.
func compactFuzzSetup(tb testing.TB) (*Ledger, *redis.Client, []string) {
	compactFuzzOnce.Do(func() {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			tb.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true})
		pol, err := ParsePolicies([]byte("tools:\n  - match: \"*\"\n    retention: 1s\n    retain_grace: 0s\n    tombstone_retention: 1h\n"))
		if err != nil {
			tb.Fatal(err)
		}
		l, err := New(rdb, Options{Policies: pol})
		if err != nil {
			tb.Fatal(err)
		}
		ctx := context.Background()
		who := Principal{Tenant: "seed", ID: "p"}
		var seeds []string
		for i, out := range []Outcome{OutcomeSucceeded, OutcomeFailedFinal, OutcomeFailedRetryable, 0} {
			id := strings.Repeat("x", i+1)
			r, err := l.Reserve(ctx, who, ReserveRequest{OperationID: id, Tool: "t", Params: map[string]any{"a": 1.0}, Holder: "h"})
			if err != nil {
				tb.Fatal(err)
			}
			if out != 0 {
				req := CompleteRequest{OperationID: id, FencingToken: r.Operation.FencingToken, Outcome: out,
					Result: &Result{ResourceID: "r", Data: []byte(`{"d":"customer"}`)}}
				if out != OutcomeSucceeded {
					req.Result, req.Failure = nil, &Failure{Code: "c", Message: "customer"}
				}
				if _, err := l.Complete(ctx, who, req); err != nil {
					tb.Fatal(err)
				}
			}
			v, err := rdb.Get(ctx, l.keys.op(who.Tenant, id).all[0]).Result()
			if err != nil {
				tb.Fatal(err)
			}
			seeds = append(seeds, v)
		}
		// The store's clock moves on past the seeds' retention.
		compactFuzzNow = time.Now().Add(time.Hour).Truncate(time.Millisecond)
		m.SetTime(compactFuzzNow)
		compactFuzzL, compactFuzzRDB, compactFuzzSeed = l, rdb, seeds
	})
	return compactFuzzL, compactFuzzRDB, compactFuzzSeed
}

// FuzzCompactScript runs the compaction script on arbitrary values stored
// under a record's key. It never fails on one (a value it cannot read must
// not stop a walk), it writes only a terminal record past its retention (as
// the Go decoder reads it), then only its tombstone (tombstoneOf: the first
// four fields, an empty attempt, the consequential fields and the history
// chain's head) with the key's
// TTL, and what it leaves is read as expired.
func FuzzCompactScript(f *testing.F) {
	l, rdb, seeds := compactFuzzSetup(f)
	for _, s := range seeds {
		f.Add(s)
	}
	f.Add("L" + strings.Repeat("f", 32) + "3\xff1d\xffk1\xffs\xff2\xff")
	f.Add("L")
	f.Add("")
	who := Principal{Tenant: "fuzz", ID: "p"}
	key := l.keys.op(who.Tenant, "op").all[0]
	f.Fuzz(func(t *testing.T, v string) {
		ctx := context.Background()
		if err := rdb.Set(ctx, key, v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		n, err := compactScript.Run(ctx, rdb, []string{key}).Int()
		if err != nil {
			t.Fatalf("compact.lua on %q: %v", v, err)
		}
		after, err := rdb.Get(ctx, key).Result()
		if err != nil {
			t.Fatalf("the key is gone after compact.lua on %q: %v", v, err)
		}
		if n == 0 {
			if after != v {
				t.Fatalf("compact.lua said it left %q alone, and wrote %q", v, after)
			}
			return
		}
		o, _, derr := decodeRecord(v)
		if derr != nil || !o.State.Terminal() || o.ExpiresAt.After(compactFuzzNow) {
			t.Fatalf("compact.lua cut %q, which is no terminal record past its retention (%+v, %v)", v, o, derr)
		}
		if want := tombstoneOf(v); after != want {
			t.Fatalf("compact.lua wrote %q for %q: want its tombstone %q", after, v, want)
		}
		if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Hour {
			t.Fatalf("PTTL after compaction = %v, want the hour it had", ttl)
		}
		if _, err := l.Lookup(ctx, who, "op"); KindOf(err) != KindKeyExpired {
			t.Fatalf("Lookup of the tombstone cut from %q = %v, want expired", v, err)
		}
	})
}
