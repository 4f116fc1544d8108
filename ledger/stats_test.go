package ledger

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// TestLiveCountsShowDrift: a live count below zero (the counts drifted from
// the records: a restore of the store, a manual edit, a defect) stays in the
// stats hash as it is, and LiveCounts reports it, instead of the count
// vanishing as if nothing were there. Only a count at exactly 0 is deleted,
// so the transitions of an operation's life leave no field behind.
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
		// 0: the field is deleted.
		var ids []string
		for i := 0; len(ids) < 2; i++ {
			if id := "again-" + strconv.Itoa(i); shardOf(e.who.Tenant, id) == shard {
				ids = append(ids, id)
			}
		}
		for _, id := range ids {
			e.execute(t, id, tool)
		}
		if n, err := e.rdb.HExists(e.ctx, stats, field(StateRunning)).Result(); err != nil || n {
			t.Fatalf("stats field %s at 0 still there (%v, %v)", field(StateRunning), n, err)
		}
		if got := liveFor(t, e); len(got) != 0 {
			t.Fatalf("live counts back at 0 = %v, want none", got)
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
