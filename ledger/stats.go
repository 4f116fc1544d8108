package ledger

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// LiveCount is how many non-terminal operations of one tenant and tool are
// in one state.
type LiveCount struct {
	Tenant, Tool string
	State        State
	// N is the sum of the shards' counts. It may be below zero: the counts
	// drifted from the records (a restore of the store, a manual edit).
	N int64
	// Negative is the sum of the shards' counts that are below zero (0 when
	// none is): no transition takes a count there, so anything but 0 is a
	// drift, which N alone may hide when other shards count operations.
	Negative int64
}

// OverdueCount is how many operations of one tenant, tool, effect and state
// nothing has moved within the recovery window: UNKNOWN past unknown since +
// window, PENDING past pending since + window, and idempotent or read-only
// RUNNING past lease end + window (listed by the sweeper).
type OverdueCount struct {
	Tenant, Tool string
	Effect       Effect
	State        State
	N            int64
}

// overdueScan bounds the overdue members read per shard; beyond it the
// count is still exact (ZCOUNT) but attributed to the first ones' labels.
const overdueScan = 10000

// LiveCounts reads the live counts every transition script maintains (one
// round trip over all shards), for the unresolved-operations gauges. A
// count below zero is reported as it is (see LiveCount).
func (l *Ledger) LiveCounts(ctx context.Context) ([]LiveCount, error) {
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, NumShards)
	for s := range NumShards {
		cmds[s] = pipe.HGetAll(ctx, l.keys.stats(s))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, storeError("ledger.LiveCounts", err)
	}
	type key struct {
		tenant, tool string
		state        State
	}
	sum := map[key]*LiveCount{}
	for _, c := range cmds {
		for field, v := range c.Val() {
			parts := strings.Split(field, "|")
			n, err := strconv.ParseInt(v, 10, 64)
			if len(parts) != 3 || err != nil || n == 0 {
				continue
			}
			tenant, err := decodeComponent(parts[2])
			if err != nil {
				continue
			}
			k := key{tenant, parts[0], parseState(parts[1])}
			lc := sum[k]
			if lc == nil {
				lc = &LiveCount{Tenant: k.tenant, Tool: k.tool, State: k.state}
				sum[k] = lc
			}
			lc.N += n
			if n < 0 {
				lc.Negative += n
			}
		}
	}
	out := make([]LiveCount, 0, len(sum))
	for _, lc := range sum {
		out = append(out, *lc)
	}
	return out, nil
}

// PruneCounts deletes the live counts at 0 of every shard and returns how
// many it deleted. A transition leaves a count at 0 where it is, so that
// an operation's cycle costs no HDEL; RunSweeper calls this every
// PruneInterval, so a tool or tenant no longer used leaves no fields
// behind. A count that is not 0 when its shard is pruned stays. Each
// shard's script is reported as an EventScript (op "PruneCounts").
func (l *Ledger) PruneCounts(ctx context.Context) (int, error) {
	n := 0
	for s := range NumShards {
		start := time.Now()
		var v int64
		var err error
		l.try(ctx, func(w way) error {
			v, err = pruneScript.send(ctx, l.rdb, w, []string{l.keys.stats(s)}, nil).Int64()
			return err
		})
		if err := l.reported("ledger.PruneCounts", start, err); err != nil {
			return n, err
		}
		n += int(v)
	}
	return n, nil
}

// Overdue counts the operations past their recovery window (OverdueCount), by the
// store's clock (one round trip over all shards, after reading the time).
func (l *Ledger) Overdue(ctx context.Context) ([]OverdueCount, error) {
	const op = "ledger.Overdue"
	now, err := l.rdb.Time(ctx).Result()
	if err != nil {
		return nil, storeError(op, err)
	}
	max := strconv.FormatInt(now.UnixMilli(), 10)
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.StringSliceCmd, NumShards)
	for s := range NumShards {
		cmds[s] = pipe.ZRangeByScore(ctx, l.keys.overdue(s), &redis.ZRangeBy{Min: "-inf", Max: max, Count: overdueScan})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, storeError(op, err)
	}
	sum := map[OverdueCount]int64{}
	for _, c := range cmds {
		for _, m := range c.Val() {
			parts := strings.SplitN(m, "|", 4)
			if len(parts) != 4 {
				continue
			}
			t, _, _ := strings.Cut(parts[3], ":")
			tenant, err := decodeComponent(t)
			if err != nil {
				continue
			}
			sum[OverdueCount{Tenant: tenant, Tool: parts[2], Effect: Effect(parseUint(parts[1])), State: parseState(parts[0])}]++
		}
	}
	out := make([]OverdueCount, 0, len(sum))
	for k, n := range sum {
		k.N = n
		out = append(out, k)
	}
	return out, nil
}

// StoreTime returns the store's clock.
func (l *Ledger) StoreTime(ctx context.Context) (time.Time, error) {
	t, err := l.rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, storeError("ledger.StoreTime", err)
	}
	return t, nil
}
