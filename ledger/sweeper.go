package ledger

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// sweepBatch bounds the expired leases one Sweep handles per shard; the next
// pass takes the rest.
const sweepBatch = 256

// DefaultSweepInterval is how often RunSweeper looks for expired leases.
const DefaultSweepInterval = time.Second

// PruneInterval is how often RunSweeper deletes the live counts at 0
// (PruneCounts): at its first pass, then with the first pass at least this
// long after the last prune.
const PruneInterval = time.Minute

// Sweep makes one pass over the lease index: every RUNNING irreversible
// operation whose lease has expired becomes UNKNOWN (LEASE_EXPIRED), so an
// abandoned claim is visible, and alertable, without anyone retrying it.
// Idempotent and read-only operations stay RUNNING past their lease until
// the next Reserve reclaims them; their index entries are dropped.
//
// The candidates are read with the store's clock and each one is decided by
// the expire script with it again, so many ledger instances may sweep the
// same store at once. Sweep returns how many operations became UNKNOWN.
func (l *Ledger) Sweep(ctx context.Context) (int, error) {
	const op = "ledger.Sweep"
	cmds, err := l.sweepCandidates(ctx)
	if err != nil {
		return 0, err
	}
	moved := 0
	var firstErr error // one operation's failure does not stop the pass
	for s, c := range cmds {
		for _, member := range c.Val() {
			k, err := l.keys.opFromLeaseMember(member)
			if err != nil {
				// Not written by this ledger: drop it rather than trip over it
				// on every pass.
				err = l.rdb.ZRem(ctx, l.keys.leases(s), member).Err()
				if err != nil && firstErr == nil {
					firstErr = storeError(op, err)
				}
				continue
			}
			_, aux, _, _, err := l.run(ctx, op, expireScript, k, SweeperPrincipal)
			if aux == "unknown" {
				// Counted whenever the script made it UNKNOWN, also when
				// the WAIT marker or WAIT after it failed: the next pass
				// will not find it again.
				moved++
			}
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				if ctx.Err() != nil {
					return moved, firstErr
				}
			}
		}
	}
	return moved, firstErr
}

// sweepCandidates reads the store's time and the expired leases of every
// shard. Like every script, the read is reported as an EventScript (op
// "Sweep"), so that a store the sweeper cannot reach counts as a store error
// even when no caller is there to see one.
func (l *Ledger) sweepCandidates(ctx context.Context) ([]*redis.StringSliceCmd, error) {
	const op = "ledger.Sweep"
	start := time.Now()
	fail := func(err error) ([]*redis.StringSliceCmd, error) {
		err = storeError(op, err)
		if ctx.Err() != nil { // stopped, not a store error
			return nil, err
		}
		l.emit(Event{Type: EventScript, Op: "Sweep", Duration: time.Since(start), Failed: true, ErrKind: KindOf(err)})
		return nil, err
	}
	now, err := l.rdb.Time(ctx).Result()
	if err != nil {
		return fail(err)
	}
	max := strconv.FormatInt(now.UnixMilli(), 10)
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.StringSliceCmd, NumShards)
	for s := range NumShards {
		cmds[s] = pipe.ZRangeByScore(ctx, l.keys.leases(s), &redis.ZRangeBy{Min: "-inf", Max: max, Count: sweepBatch})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fail(err)
	}
	l.emit(Event{Type: EventScript, Op: "Sweep", Duration: time.Since(start)})
	return cmds, nil
}

// RunSweeper calls Sweep every interval (DefaultSweepInterval when not
// positive), and PruneCounts every PruneInterval, until ctx ends. Errors
// are logged and the next pass tries again.
func (l *Ledger) RunSweeper(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultSweepInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var pruned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(pruned) >= PruneInterval {
			pruned = time.Now()
			if _, err := l.PruneCounts(ctx); err != nil && ctx.Err() == nil {
				l.log.Warn("pruning the live counts failed", "error", err)
			}
		}
		n, err := l.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			l.log.Warn("lease sweep failed", "error", err)
		}
		if n > 0 {
			l.log.Info("lease sweep: operations became UNKNOWN", "count", n)
		}
	}
}
