// Package autopipe batches the scripts (and EXISTS, sent with Do) that
// concurrent callers send through one go-redis client into pipelines: one
// write and one read per batch instead of one of each per command. It is a
// go-redis hook, so the client keeps its type and everything else goes out
// as before. A caller that finds a free lane sends the batch itself; a call
// whose context ends while queued is never sent; on Redis Cluster each
// master has its own queue and lanes. Only commands safe to run twice may
// be batched. docs/design.md ("The autopipeline") has the whole behaviour
// and why.
package autopipe

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options configure a Hook.
type Options struct {
	// Lanes is how many batches may be in flight at once, each on a
	// connection of its own (2 when 0): while one waits for its replies the
	// next one fills. On Redis Cluster, each master has as many.
	Lanes int
	// MaxBatch bounds the commands of one batch (256 when 0).
	MaxBatch int
}

// Hook is the batching go-redis hook. Install it with Enable.
type Hook struct {
	rdb      redis.UniversalClient
	lanes    int
	maxBatch int
	closed   atomic.Bool
	batches  atomic.Int64
	commands atomic.Int64

	mu sync.Mutex
	// queue is the only queue on one server; on Redis Cluster, the queue
	// of the scripts with no master to join.
	queue
	// masters are the queues of Redis Cluster masters that have calls
	// queued or batches in flight, by the master's client. A queue goes
	// when its last lane is freed: the map keeps no master that left the
	// cluster.
	masters map[*redis.Client]*queue
}

// A queue is where calls wait for a lane, with the lanes that serve them.
// Its fields are guarded by Hook.mu.
type queue struct {
	pending []*call       // queued, oldest first
	active  int           // lanes in use (callers sending batches)
	master  *redis.Client // its key in Hook.masters; nil: Hook.queue
}

// The states of a call, guarded by Hook.mu.
const (
	queued    = iota // in pending
	sent             // in a batch in flight
	answered         // its batch returned: inner holds the reply
	abandoned        // its caller's context ended first
)

type call struct {
	queue    *queue // its queue, set by do; guarded by Hook.mu
	inner    *redis.Cmd
	done     <-chan struct{} // its context's; nil: it cannot end
	deadline time.Time       // zero: none
	wake     chan struct{}
	state    int  // guarded by Hook.mu
	lead     bool // guarded by Hook.mu: the caller must take over a lane
}

// Enable adds a Hook to rdb that batches its scripts (EVAL, EVALSHA, FCALL)
// and the EXISTS commands it sends with Do, and returns it. Close it before
// closing rdb.
func Enable(rdb redis.UniversalClient, o Options) *Hook {
	if o.Lanes <= 0 {
		o.Lanes = 2
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 256
	}
	h := &Hook{rdb: rdb, lanes: o.Lanes, maxBatch: o.MaxBatch}
	rdb.AddHook(h)
	return h
}

// Close stops batching: later commands go out one by one. Calls already
// queued are still sent.
func (h *Hook) Close() { h.closed.Store(true) }

// Stats returns how many batches and commands the hook has sent.
func (h *Hook) Stats() (batches, commands int64) {
	return h.batches.Load(), h.commands.Load()
}

// DialHook implements redis.Hook.
func (h *Hook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook implements redis.Hook: explicit pipelines (and the
// hook's own batches) go out as they are.
func (h *Hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// ProcessHook implements redis.Hook: scripts and EXISTS sent as a
// *redis.Cmd (by Do) join a batch; everything else goes out as it is.
func (h *Hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c, ok := cmd.(*redis.Cmd)
		if !ok || h.closed.Load() {
			return next(ctx, cmd)
		}
		if _, batched := keyAt(cmd.Name()); !batched {
			return next(ctx, cmd)
		}
		if err := ctx.Err(); err != nil {
			c.SetErr(err)
			return err
		}
		q := &call{inner: redis.NewCmd(ctx, c.Args()...), done: ctx.Done(), wake: make(chan struct{}, 1)}
		q.deadline, _ = ctx.Deadline()
		if err := h.do(ctx, q, h.masterOf(ctx, q.inner), next); err != nil {
			c.SetErr(err)
			return err
		}
		c.SetVal(q.inner.Val())
		c.SetErr(q.inner.Err())
		return q.inner.Err()
	}
}

// masterOf returns, on Redis Cluster, the client of the master that serves
// the first key of cmd in the client's slot map; nil on one server, or for
// a script with no key, or when the slot map cannot be had.
func (h *Hook) masterOf(ctx context.Context, cmd *redis.Cmd) *redis.Client {
	cc, ok := h.rdb.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	key, ok := firstKey(cmd)
	if !ok {
		return nil
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil
	}
	return node
}

// do sends q, in a batch this caller sends itself or in one another caller
// sends, through the queue of master (Hook.queue when nil), and returns
// once q is answered (nil) or ctx ended (its error).
func (h *Hook) do(ctx context.Context, q *call, master *redis.Client, next redis.ProcessHook) error {
	h.mu.Lock()
	qu := &h.queue
	if master != nil {
		if qu = h.masters[master]; qu == nil {
			if h.masters == nil {
				h.masters = map[*redis.Client]*queue{}
			}
			qu = &queue{master: master}
			h.masters[master] = qu
		}
	}
	q.queue = qu
	qu.pending = append(qu.pending, q)
	if qu.active < h.lanes {
		qu.active++
		q.lead = true
	}
	var buf [8]*call
	batch := buf[:0]
	for {
		switch {
		case q.state == answered || q.state == abandoned:
			if q.lead {
				h.release(qu)
			}
			done := q.state == answered
			h.mu.Unlock()
			if done {
				return nil
			}
			return ctxErr(ctx)
		case q.lead && q.state == sent:
			// q went out in another lane's batch: pass the lane on, and
			// wait for that batch like any other caller.
			q.lead = false
			h.release(qu)
		case q.lead:
			if batch = h.take(qu, batch[:0]); len(batch) > 0 {
				h.mu.Unlock()
				h.send(ctx, q, batch, next) // returns with h.mu held
				continue
			}
			continue // q's context ended: take abandoned it
		}
		h.mu.Unlock()
		select {
		case <-q.wake:
			h.mu.Lock()
		case <-ctx.Done():
			h.mu.Lock()
			if q.state == queued || q.state == sent {
				q.state = abandoned
			}
		}
	}
}

// ctxErr is ctx's error, or DeadlineExceeded when its deadline has passed
// before its timer fired.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// send sends batch, taken from the queue by q's caller on q's lane, and
// returns with h.mu held once the batch's replies are in, or once q's caller
// is done without them (ctx ended, or q was answered in another lane's
// batch, or ahead of the rest of its own). A batch of q alone goes out
// through the client's own path under ctx, as a plain call would. A larger
// one goes out from this goroutine when ctx cannot end and the client is
// not a cluster client, and otherwise from a goroutine of its own, so that
// the caller can return at its context's end, or once its own reply is in
// (on Cluster, replies come in as each node answers: see exec), while the
// batch runs on: the lane then stays with the batch, which hands it on when
// its replies are in.
func (h *Hook) send(ctx context.Context, q *call, batch []*call, next redis.ProcessHook) {
	if len(batch) == 1 && batch[0] == q {
		h.count(batch)
		if err := next(ctx, q.inner); err != nil {
			// The client's own path leaves setting the error to its
			// caller (Process).
			q.inner.SetErr(err)
		}
		h.mu.Lock()
		h.answer(batch, q)
		return
	}
	_, cluster := h.rdb.(*redis.ClusterClient)
	if ctx.Done() == nil && !cluster {
		h.exec(batch, next, nil)
		h.mu.Lock()
		h.answer(batch, q)
		return
	}
	f := &flight{}
	flying := slices.Clone(batch) // batch may be on the caller's stack
	go func() {
		h.exec(flying, next, func(in []*call) {
			h.mu.Lock()
			h.answer(in, nil)
			h.mu.Unlock()
		})
		h.mu.Lock()
		h.answer(flying, nil)
		f.landed = true
		if f.orphaned {
			h.release(q.queue)
		} else {
			// q's caller may not be in the batch (its command was not among
			// the oldest MaxBatch): it sends the next one.
			wake(q)
		}
		h.mu.Unlock()
	}()
	for {
		select {
		case <-q.wake:
			h.mu.Lock()
		case <-ctx.Done():
			h.mu.Lock()
			if !f.landed && (q.state == queued || q.state == sent) {
				q.state = abandoned
			}
		}
		if f.landed {
			return
		}
		if q.state == answered || q.state == abandoned {
			// The caller is done (q went out in another batch, or its
			// context ended): it leaves, and its lane goes with the batch.
			f.orphaned = true
			q.lead = false
			return
		}
		h.mu.Unlock()
	}
}

// A flight is a batch sent from a goroutine of its own. Its fields are
// guarded by Hook.mu.
type flight struct {
	landed   bool // its replies are in
	orphaned bool // its caller left: it releases the lane when it lands
}

// answer marks the calls of batch still waiting for it answered and wakes
// their callers, all but except's. h.mu is held.
func (h *Hook) answer(batch []*call, except *call) {
	for _, c := range batch {
		if c.state == sent {
			c.state = answered
			if c != except {
				wake(c)
			}
		}
	}
}

// take moves the oldest calls queued in qu, up to MaxBatch, into batch and
// returns it. A call whose context has ended, or whose deadline has passed,
// is not taken: it is abandoned and its caller woken, so it is never sent.
// h.mu is held.
func (h *Hook) take(qu *queue, batch []*call) []*call {
	var now time.Time
	n := 0
	for _, c := range qu.pending {
		if len(batch) == h.maxBatch {
			break
		}
		n++
		if c.state != queued {
			continue
		}
		if c.ended(&now) {
			c.state = abandoned
			wake(c)
			continue
		}
		c.state = sent
		batch = append(batch, c)
	}
	// Delete clears the slots it vacates: the queue's array keeps no call
	// that left it.
	qu.pending = slices.Delete(qu.pending, 0, n)
	return batch
}

// ended reports whether c's context has ended or its deadline has passed;
// *now is the time, read on first need.
func (c *call) ended(now *time.Time) bool {
	select {
	case <-c.done:
		return true
	default:
	}
	if c.deadline.IsZero() {
		return false
	}
	if now.IsZero() {
		*now = time.Now()
	}
	return !now.Before(c.deadline)
}

// wake signals c's caller; one pending signal is enough, since the caller
// looks at its state when it wakes.
func wake(c *call) {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// release hands the caller's lane of qu to the oldest caller queued in qu,
// or frees it. A queued caller whose context has ended, or whose deadline
// has passed (as take sees it), is passed over: its call is abandoned and
// the caller woken. h.mu is held.
func (h *Hook) release(qu *queue) {
	var now time.Time
	for _, c := range qu.pending {
		if c.state != queued || c.lead {
			continue
		}
		if c.ended(&now) {
			c.state = abandoned
			wake(c)
			continue
		}
		c.lead = true
		wake(c)
		return
	}
	qu.active--
	// No queued caller is left to take the calls abandoned in the queue
	// out of it: they go now, so that the queue keeps nothing of callers
	// that are gone (their arguments, their contexts) until the next call.
	qu.pending = slices.DeleteFunc(qu.pending, func(c *call) bool { return c.state != queued })
	if qu.active == 0 && qu.master != nil {
		// Nothing is queued (a queued caller would have had the lane) and
		// no lane is left: a master's queue goes.
		delete(h.masters, qu.master)
	}
}

// count adds batch to the hook's statistics.
func (h *Hook) count(batch []*call) {
	h.batches.Add(1)
	h.commands.Add(int64(len(batch)))
}

// exec sends one batch, under the latest deadline among its callers (none if
// one has none): alone through the client's own path, or as a pipeline. On
// Redis Cluster it passes in, when not nil, the calls whose replies are in
// as they come in (see execCluster), before it returns with the rest.
func (h *Hook) exec(batch []*call, next redis.ProcessHook, in func([]*call)) {
	ctx := context.Background()
	var latest time.Time
	for _, c := range batch {
		if c.deadline.IsZero() {
			latest = time.Time{}
			break
		}
		if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	if !latest.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	h.count(batch)
	if len(batch) == 1 {
		// The client's own path, which leaves setting the error to its
		// caller (Process).
		if err := next(ctx, batch[0].inner); err != nil {
			batch[0].inner.SetErr(err)
		}
		return
	}
	if cc, ok := h.rdb.(*redis.ClusterClient); ok {
		execCluster(ctx, cc, batch, next, in)
		return
	}
	pipe := h.rdb.Pipeline()
	for _, c := range batch {
		_ = pipe.Process(ctx, c.inner)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
}

// execCluster sends a batch on Redis Cluster: the commands of each master
// in one pipeline on that master's own client, the masters at once. A
// command that a node refuses without running it (its slot is served
// elsewhere or is being moved: MOVED, ASK, TRYAGAIN; the cluster or the node
// is not ready) then goes out again alone, through the client's own path,
// which follows the redirection or waits and tries again for that command
// only; the others are answered as they were. A command with no key, or
// whose master the client cannot tell, goes out alone that way too.
//
// When in is not nil, execCluster passes it the calls whose replies are in
// as they come in: each master's share as soon as that master has answered
// (but the commands it refused), and each command sent alone as soon as it
// returns. A node that hangs, or a redirection to one, then holds only the
// callers of the commands it has, not those of the whole batch.
//
// go-redis's cluster pipeline is not used for this: when a node answers the
// first command of its share of a pipeline with TRYAGAIN, it sends that
// whole share again (up to MaxRedirects times), so every other script in it
// runs again each time, and a command it was told to ASK another node about
// goes to both nodes at once.
func execCluster(ctx context.Context, cc *redis.ClusterClient, batch []*call, next redis.ProcessHook, in func([]*call)) {
	if in == nil {
		in = func([]*call) {}
	}
	var wg sync.WaitGroup
	// alone sends c alone through the client's own path.
	alone := func(c *call) {
		wg.Go(func() {
			c.inner.SetErr(nil)
			// The client's own path leaves setting the error to its caller.
			if err := next(ctx, c.inner); err != nil {
				c.inner.SetErr(err)
			}
			in([]*call{c})
		})
	}
	byNode := map[*redis.Client][]*call{}
	for _, c := range batch {
		if key, ok := firstKey(c.inner); ok {
			if node, err := cc.MasterForKey(ctx, key); err == nil {
				byNode[node] = append(byNode[node], c)
				continue
			}
		}
		alone(c)
	}
	for node, calls := range byNode {
		wg.Go(func() {
			pipe := node.Pipeline()
			for _, c := range calls {
				_ = pipe.Process(ctx, c.inner)
			}
			_, _ = pipe.Exec(ctx) // each command carries its own error
			answered := calls[:0] // calls is this goroutine's own
			for _, c := range calls {
				if notRun(c.inner.Err()) {
					// wg.Go before wg.Wait returns: wg counts this
					// goroutine until it ends.
					alone(c)
				} else {
					answered = append(answered, c)
				}
			}
			if len(answered) > 0 {
				in(answered)
			}
		})
	}
	wg.Wait()
}

// scriptKey is where a script's first key is in its arguments: after the
// script (or function) and its key count.
const scriptKey = 3

// keyAt returns where the first key of a command the hook batches is in
// its arguments, and whether it batches the command at all: scripts, and
// EXISTS, which only reads.
func keyAt(name string) (int, bool) {
	switch name {
	case "fcall", "evalsha", "eval", "evalsha_ro", "eval_ro":
		return scriptKey, true
	case "exists":
		return 1, true
	}
	return 0, false
}

// firstKey returns the first key a command the hook batches names, if any.
func firstKey(cmd *redis.Cmd) (string, bool) {
	args := cmd.Args()
	at, ok := keyAt(cmd.Name())
	if !ok || len(args) <= at || (at == scriptKey && keyCount(args[2]) < 1) {
		return "", false
	}
	key, ok := args[at].(string)
	return key, ok
}

// keyCount is a script's key count as go-redis holds it (0 when it is
// not a number).
func keyCount(v any) int64 {
	switch n := v.(type) {
	case int:
		return int64(n)
	case int64:
		return n
	}
	return 0
}

// notRun reports whether err is a cluster node's refusal of a command it
// did not run: the slot is served by another node or being moved (MOVED,
// ASK, TRYAGAIN), or the cluster or the node cannot serve it now
// (CLUSTERDOWN, LOADING, READONLY, MASTERDOWN).
func notRun(err error) bool {
	for _, p := range []string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "LOADING", "READONLY", "MASTERDOWN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}
