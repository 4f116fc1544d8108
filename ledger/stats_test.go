package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestLiveCountsShowDrift: a live count below zero (the counts drifted from
// the records: a restore of the store, a manual edit, a defect) stays in the
// stats hash as it is, and LiveCounts reports it, instead of the count
// vanishing as if nothing were there. A count at exactly 0 stays until
// PruneCounts deletes it, so the transitions of an operation's life leave
// no field behind the prune.
func TestLiveCountsShowDrift(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		const tool = "drift.refund"
		running := e.execute(t, "drifted", tool)
		if got := liveFor(t, e); got[StateRunning] != 1 || len(got) != 1 {
			t.Fatalf("live counts = %v, want 1 RUNNING", got)
		}
		shard := shardOf(e.who.Tenant, "drifted")
		stats := e.l.keys.stats(shard)
		field := func(st State) string {
			return fmt.Sprintf("%s|%d|%s", tool, st, encodeComponent(e.who.Tenant))
		}
		// Two RUNNING operations fewer than the records: the count reads -1.
		if err := e.rdb.HIncrBy(e.ctx, stats, field(StateRunning), -2).Err(); err != nil {
			t.Fatal(err)
		}
		if got := liveFor(t, e); got[StateRunning] != -1 {
			t.Fatalf("live counts after the drift = %v, want -1 RUNNING", got)
		}
		counts, err := e.l.LiveCounts(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range counts {
			if c.Tenant == e.who.Tenant && c.Negative != -1 {
				t.Errorf("live count %+v: want Negative -1", c)
			}
		}
		// A transition out of RUNNING takes it further below zero, and the
		// count stays.
		if _, err := e.complete(t, "drifted", running.FencingToken, OutcomeSucceeded, nil, nil); err != nil {
			t.Fatal(err)
		}
		if got := liveFor(t, e); got[StateRunning] != -2 {
			t.Fatalf("live counts after a transition out of RUNNING = %v, want -2 RUNNING", got)
		}
		if v, err := e.rdb.HGet(e.ctx, stats, field(StateRunning)).Result(); err != nil || v != "-2" {
			t.Fatalf("stats field %s = %q, %v, want -2", field(StateRunning), v, err)
		}
		// Two operations entering RUNNING in the same shard bring it back to
		// 0: LiveCounts skips it, and the prune deletes it (TestPruneCounts
		// shows the 0 left for the prune: the other backends' prunes here
		// may delete it first).
		var ids []string
		for i := 0; len(ids) < 2; i++ {
			if id := "again-" + strconv.Itoa(i); shardOf(e.who.Tenant, id) == shard {
				ids = append(ids, id)
			}
		}
		for _, id := range ids {
			e.execute(t, id, tool)
		}
		if got := liveFor(t, e); len(got) != 0 {
			t.Fatalf("live counts back at 0 = %v, want none", got)
		}
		if _, err := e.l.PruneCounts(e.ctx); err != nil {
			t.Fatal(err)
		}
		if n, err := e.rdb.HExists(e.ctx, stats, field(StateRunning)).Result(); err != nil || n {
			t.Fatalf("stats field %s at 0 still there after the prune (%v, %v)", field(StateRunning), n, err)
		}

		// A whole life leaves no field at 0 behind: RUNNING, PENDING,
		// RUNNING again, UNKNOWN, SUCCEEDED.
		const life = "life.refund"
		o := e.execute(t, "life", life)
		if _, err := e.complete(t, "life", o.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
			t.Fatal(err)
		}
		o = e.execute(t, "life", life)
		if _, err := e.l.MarkUnknown(e.ctx, e.who, MarkUnknownRequest{OperationID: "life", FencingToken: o.FencingToken}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.reconcile(t, "life", FindingApplied, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := e.l.PruneCounts(e.ctx); err != nil {
			t.Fatal(err)
		}
		fields, err := e.rdb.HGetAll(e.ctx, e.l.keys.stats(shardOf(e.who.Tenant, "life"))).Result()
		if err != nil {
			t.Fatal(err)
		}
		for f, v := range fields {
			if strings.HasPrefix(f, life+"|") && strings.HasSuffix(f, "|"+encodeComponent(e.who.Tenant)) {
				t.Errorf("stats field %s = %s left behind by a resolved operation", f, v)
			}
		}
	})
}

// TestPruneCounts: the prune deletes exactly the live counts at 0, in
// every shard; an operation's cycle leaves its count at 0 for it, and
// RunSweeper prunes at its first pass. A count above or below 0 stays.
// Each backend gets a ledger of its own prefix, so no other test's counts
// are pruned and the counts are exact.
func TestPruneCounts(t *testing.T) {
	cases := []struct {
		name   string
		values []string // one field per value, in shard 3
		kept   []string // the values left, in order
	}{
		{"none", nil, nil},
		{"at 0", []string{"0"}, nil},
		{"above and below 0", []string{"2", "-1"}, []string{"2", "-1"}},
		{"mixed", []string{"0", "1", "0", "-3", "0"}, []string{"1", "-3"}},
		// More than one HDEL takes (a thousand fields each).
		{"many at 0", append(slices.Repeat([]string{"0"}, 2500), "7"), []string{"7"}},
	}
	pol, err := ParsePolicies([]byte(ledgertest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		e := newEnv(t, rdb, pol)
		l, err := New(rdb, Options{Policies: pol, Prefix: "prune-" + randomHex(6)})
		if err != nil {
			t.Fatal(err)
		}
		e.l = l
		const shard = 3
		stats := e.l.keys.stats(shard)
		fieldOf := func(i int) string {
			return fmt.Sprintf("prune.t%d|2|%s", i, encodeComponent(e.who.Tenant))
		}
		for _, c := range cases {
			for i, v := range c.values {
				if err := e.rdb.HSet(e.ctx, stats, fieldOf(i), v).Err(); err != nil {
					t.Fatal(err)
				}
			}
			n, err := e.l.PruneCounts(e.ctx)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if want := len(c.values) - len(c.kept); n != want {
				t.Errorf("%s: pruned %d, want %d", c.name, n, want)
			}
			var kept []string
			for i := range c.values {
				if v, err := e.rdb.HGet(e.ctx, stats, fieldOf(i)).Result(); err == nil {
					kept = append(kept, v)
				} else if !errors.Is(err, redis.Nil) {
					t.Fatal(err)
				}
			}
			if !slices.Equal(kept, c.kept) {
				t.Errorf("%s: left %v, want %v", c.name, kept, c.kept)
			}
			if err := e.rdb.Del(e.ctx, stats).Err(); err != nil {
				t.Fatal(err)
			}
		}

		// A Reserve and its Complete leave the RUNNING count at 0: no HDEL
		// in the cycle.
		const tool = "prune.refund"
		o := e.execute(t, "cycle", tool)
		if _, err := e.complete(t, "cycle", o.FencingToken, OutcomeSucceeded, nil, nil); err != nil {
			t.Fatal(err)
		}
		running := e.l.keys.stats(shardOf(e.who.Tenant, "cycle"))
		field := tool + "|2|" + encodeComponent(e.who.Tenant)
		if v, err := e.rdb.HGet(e.ctx, running, field).Result(); err != nil || v != "0" {
			t.Fatalf("after the cycle, stats field %s = %q, %v, want 0", field, v, err)
		}

		// The sweeper prunes it at its first pass.
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan struct{})
		go func() { defer close(done); e.l.RunSweeper(ctx, 10*time.Millisecond) }()
		defer func() { cancel(); <-done }()
		for i := 0; ; i++ {
			there, err := e.rdb.HExists(e.ctx, running, field).Result()
			if err != nil {
				t.Fatal(err)
			}
			if !there {
				break
			}
			if i == 500 {
				t.Fatal("RunSweeper left a live count at 0 for 500 polls")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
