package ledger

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultCompactBatch is how many keys RunCompactor looks at on each master
// per tick (DefaultCompactInterval): 250 a second walks 5 million keys in
// under 6 hours, 21 million a day, at a few hundred cheap script calls a
// second.
const DefaultCompactBatch = 250

// DefaultCompactInterval is RunCompactor's tick.
const DefaultCompactInterval = time.Second

// CompactStats say what a compaction Step or Pass did.
type CompactStats struct {
	// Examined is how many keys it looked at.
	Examined int
	// Compacted is how many terminal records past their retention it cut
	// to their tombstone.
	Compacted int
	// Passes is how many masters' walks reached the end of the keyspace
	// (each is then a complete pass over that master's keys).
	Passes int
}

// Compactor cuts terminal records past their retention to their tombstone
// (scripts/compact.lua): a record lives on as its own tombstone for the
// tombstone retention (contract.md §6), and only its fingerprint and final state
// are ever read again, so the result data, the failure and the history go
// at the end of the retention instead of lasting until the key expires.
//
// It walks the ledger's record keys (<prefix>:{sNN}:op:*) with SCAN, a
// bounded number of keys per Step, on every master of a Redis Cluster, and
// runs the one-key compaction script on each key it finds. The script
// decides with the store's clock and writes only a record that is due,
// keeping the key's TTL, so the walk needs no coordination: many ledger
// instances may walk the same store at once, and a key the walk misses (a
// slot moved during it) is found by the next pass. It is safe for
// concurrent use.
type Compactor struct {
	l     *Ledger
	batch int
	match string // the SCAN pattern

	mu    sync.Mutex       // guards walks
	walks map[string]*walk // by master address ("" for a single node)
}

// walk is the compactor's position on one master: the SCAN cursor, whether
// the SCAN has returned cursor 0 (the end of the keyspace), and the keys it
// returned that are not examined yet (SCAN may return more than COUNT: the
// embedded engine returns every key at once).
type walk struct {
	mu      sync.Mutex // one step at a time
	cursor  uint64
	ended   bool
	pending []string
}

// NewCompactor returns a compactor that looks at about batch keys on each
// master per Step (DefaultCompactBatch when not positive).
func (l *Ledger) NewCompactor(batch int) *Compactor {
	if batch <= 0 {
		batch = DefaultCompactBatch
	}
	return &Compactor{l: l, batch: batch, match: l.keys.prefix + ":{s[0-9][0-9]}:op:*", walks: map[string]*walk{}}
}

// Step looks at the next batch of keys on every master, continuing where
// the previous Step left off; after the end of the keyspace the walk starts
// over. It returns what it did and the first error (one master's error does
// not stop the others).
func (c *Compactor) Step(ctx context.Context) (CompactStats, error) {
	return c.each(ctx, false)
}

// Pass walks every master's keys from the start to the end once, and
// returns what it did. Records that are due are compacted whatever earlier
// Steps did; Step continues from its own position afterwards.
func (c *Compactor) Pass(ctx context.Context) (CompactStats, error) {
	return c.each(ctx, true)
}

func (c *Compactor) each(ctx context.Context, whole bool) (CompactStats, error) {
	var (
		mu    sync.Mutex
		total CompactStats
	)
	run := func(ctx context.Context, addr string, node redis.Cmdable) error {
		var st CompactStats
		var err error
		if whole {
			w := &walk{}
			for err == nil {
				var s CompactStats
				s, err = c.step(ctx, node, w)
				st.Examined, st.Compacted, st.Passes = st.Examined+s.Examined, st.Compacted+s.Compacted, st.Passes+s.Passes
				if s.Passes > 0 {
					break
				}
			}
		} else {
			c.mu.Lock()
			w := c.walks[addr]
			if w == nil {
				w = &walk{}
				c.walks[addr] = w
			}
			c.mu.Unlock()
			st, err = c.step(ctx, node, w)
		}
		mu.Lock()
		total.Examined += st.Examined
		total.Compacted += st.Compacted
		total.Passes += st.Passes
		mu.Unlock()
		return err
	}
	if cc, ok := c.l.rdb.(*redis.ClusterClient); ok {
		var (
			seenMu sync.Mutex
			seen   = map[string]bool{}
			walked bool // a master's walk ran: its error is reported by step
		)
		start := time.Now()
		err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			addr := node.Options().Addr
			seenMu.Lock()
			seen[addr] = true
			walked = true
			seenMu.Unlock()
			return run(ctx, addr, node)
		})
		if err != nil && !walked {
			// The masters could not be listed (CLUSTER SLOTS refused, no
			// node reachable): a failed store call of the pass, like a
			// failed SCAN of a walk, reported unless the pass was stopped.
			err = storeError("ledger.Compact", err)
			if ctx.Err() == nil {
				c.l.emit(Event{Type: EventScript, Op: "Compact", Duration: time.Since(start), Failed: true, ErrKind: KindOf(err)})
			}
		}
		if !whole && err == nil {
			// Forget the walks of nodes that are no masters any more (failed
			// over, removed): a node that is a master again later starts a
			// new walk.
			c.mu.Lock()
			for addr := range c.walks {
				if !seen[addr] {
					delete(c.walks, addr)
				}
			}
			c.mu.Unlock()
		}
		return total, err
	}
	err := run(ctx, "", c.l.rdb)
	return total, err
}

// step looks at the next batch of keys of one master's walk.
func (c *Compactor) step(ctx context.Context, node redis.Cmdable, w *walk) (CompactStats, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	const op = "ledger.Compact"
	var st CompactStats
	if len(w.pending) < c.batch && !w.ended {
		start := time.Now()
		keys, next, err := node.Scan(ctx, w.cursor, c.match, int64(c.batch)).Result()
		if err != nil {
			err = storeError(op, err)
			// A walk that cannot read the keys (SCAN refused, Redis out of
			// reach) is a failed store call of the pass, like a failed
			// script: reported, so that it counts as a store error, unless
			// the pass was stopped.
			if ctx.Err() == nil {
				c.l.emit(Event{Type: EventScript, Op: "Compact", Duration: time.Since(start), Failed: true, ErrKind: KindOf(err)})
			}
			return st, err
		}
		w.pending, w.cursor, w.ended = append(w.pending, keys...), next, next == 0
	}
	keys := w.pending
	if len(keys) > c.batch {
		keys = keys[:c.batch]
	}
	n, err := c.compact(ctx, node, keys)
	st.Compacted = n
	if err != nil {
		// The batch is looked at again on the next step.
		return st, err
	}
	st.Examined = len(keys)
	w.pending = w.pending[len(keys):]
	if len(w.pending) == 0 && w.ended {
		w.ended = false // the next step starts over at cursor 0
		st.Passes = 1
		c.l.emit(Event{Type: EventCompactionPass, Op: "Compact"})
	}
	return st, nil
}

// compact runs the compaction script on each key, in one pipeline, and
// returns how many records it compacted. When a key's script did not run
// (a library or script missing on the node, a store without Functions),
// the keys that failed are sent again the next way (scripts.go, next).
func (c *Compactor) compact(ctx context.Context, node redis.Cmdable, keys []string) (int, error) {
	const op = "ledger.Compact"
	if len(keys) == 0 {
		return 0, nil
	}
	start := time.Now()
	n := 0
	for w := c.l.first(); ; {
		again, firstErr := c.send(ctx, node, w, keys, &n)
		if len(again) > 0 {
			var ok bool
			if w, ok = c.l.next(ctx, w, firstErr); ok {
				keys = again
				continue
			}
		}
		if n > 0 {
			c.l.emit(Event{Type: EventCompacted, Op: "Compact", Count: n})
		}
		if firstErr != nil {
			err := storeError(op, firstErr)
			c.l.emit(Event{Type: EventScript, Op: "Compact", Duration: time.Since(start), Failed: true, ErrKind: KindOf(err)})
			return n, err
		}
		c.l.emit(Event{Type: EventScript, Op: "Compact", Duration: time.Since(start)})
		return n, nil
	}
}

// send runs the compaction script on each key the way w, in one pipeline,
// adds the records it compacted to n, and returns the keys that failed with
// the first of their errors. A key whose slot moved to another master is
// left to that master's walk: trying it here again would hold this walk at
// this batch for good.
func (c *Compactor) send(ctx context.Context, node redis.Cmdable, w way, keys []string, n *int) (failed []string, firstErr error) {
	pipe := node.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = compactScript.send(ctx, pipe, w, []string{k}, nil)
	}
	_, _ = pipe.Exec(ctx)
	for i, cmd := range cmds {
		v, err := cmd.Int64()
		switch {
		case err == nil:
			*n += int(v)
		case movedError(err):
		default:
			failed = append(failed, keys[i])
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	return failed, firstErr
}

// RunCompactor calls Step every interval (DefaultCompactInterval when not
// positive) with a Compactor of batch keys per master (DefaultCompactBatch
// when not positive) until ctx ends. Errors are logged and the next tick
// tries again.
func (l *Ledger) RunCompactor(ctx context.Context, interval time.Duration, batch int) {
	if interval <= 0 {
		interval = DefaultCompactInterval
	}
	c := l.NewCompactor(batch)
	t := time.NewTicker(interval)
	defer t.Stop()
	compacted := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := c.Step(ctx)
		if err != nil && ctx.Err() == nil {
			l.log.Warn("compaction step failed", "error", err)
		}
		compacted += st.Compacted
		if st.Passes > 0 {
			l.log.Debug("compaction: a pass over a master's keys ended", "masters", st.Passes, "compacted", compacted)
			compacted = 0
		}
	}
}
