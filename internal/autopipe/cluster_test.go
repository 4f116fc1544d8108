package autopipe

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redistest"
)

// TestClusterBatchRunsEachScriptOnce sends one batch of scripts to a Redis
// Cluster master while two of its slots are being moved to another master
// (CLUSTER SETSLOT MIGRATING / IMPORTING, as a resharding leaves them): the
// first script names a key still there and one that is not, which Redis
// refuses with TRYAGAIN; the second increments a counter in a slot that
// stays; the third increments a counter whose slot's keys have all moved
// (ASK). The batch goes out as the hook sends it when concurrent callers
// queue behind a busy lane.
//
// Each increment must be applied once: a refusal of one script must not
// make the others run again (go-redis's cluster pipeline sends a node's
// whole batch again, up to MaxRedirects times, when its first command is
// answered TRYAGAIN, and sends a command it was told to ASK elsewhere to
// both nodes at once). The refused script is answered TRYAGAIN, for its
// caller to repeat.
func TestClusterBatchRunsEachScriptOnce(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), DisableIdentity: true, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })

	src := cl.MasterFor(t, "{moving}a")
	var dst *redistest.Server
	for _, s := range cl.Nodes {
		if s != src {
			dst = s
			break
		}
	}
	// keyOn returns a key with the prefix whose slot src serves.
	keyOn := func(prefix string) string {
		for i := range 1000 {
			k := fmt.Sprintf("{%s%d}n", prefix, i)
			if cl.MasterFor(t, k) == src {
				return k
			}
		}
		t.Fatalf("no key of %s on %s", prefix, src.Addr)
		return ""
	}
	stays, gone := keyOn("stays"), keyOn("gone")
	s, d := src.Client(t), dst.Client(t)
	if err := s.Set(ctx, "{moving}a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	srcID, dstID := redistest.NodeID(t, src), redistest.NodeID(t, dst)
	for _, k := range []string{"{moving}a", gone} {
		slot, err := s.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err(); err != nil {
			t.Fatal(err)
		}
	}

	const get, incr = `return redis.call('GET', KEYS[1])`, `return redis.call('INCR', KEYS[1])`
	cmds := []*redis.Cmd{
		redis.NewCmd(ctx, "eval", get, 2, "{moving}a", "{moving}b"),
		redis.NewCmd(ctx, "eval", incr, 1, stays),
		redis.NewCmd(ctx, "eval", incr, 1, gone),
	}
	h := &Hook{rdb: rdb, lanes: 1, maxBatch: 256}
	batch := make([]*call, len(cmds))
	for i, c := range cmds {
		batch[i] = &call{inner: c}
	}
	h.exec(batch, func(ctx context.Context, cmd redis.Cmder) error { return rdb.Process(ctx, cmd) }, nil)

	if err := cmds[0].Err(); err == nil || !strings.HasPrefix(err.Error(), "TRYAGAIN") {
		t.Errorf("the script on keys split by the migration = %v, %v; want TRYAGAIN", cmds[0].Val(), err)
	}
	for _, c := range []struct {
		cmd  *redis.Cmd
		node *redis.Client
		key  string
	}{{cmds[1], s, stays}, {cmds[2], d, gone}} {
		// ASKING: the importing node serves the moved key's slot only then.
		pipe := c.node.Pipeline()
		pipe.Do(ctx, "asking")
		got := pipe.Get(ctx, c.key)
		_, _ = pipe.Exec(ctx)
		n, err := got.Int()
		if err != nil {
			t.Fatalf("GET %s on %s: %v", c.key, c.node.Options().Addr, err)
		}
		if n != 1 {
			t.Errorf("%s was incremented %d times by one script sent once (reply %v, %v)", c.key, n, c.cmd.Val(), c.cmd.Err())
		}
		if v, err := c.cmd.Int(); v != 1 || err != nil {
			t.Errorf("the increment of %s answered %v, %v; want 1", c.key, v, err)
		}
	}
}

// TestClusterBatchAfterFailover sends batches of increments, two on a shard
// whose master is killed and one on another master, on a cluster client set
// up as ledgerd's (the slot map reloaded every second; internal/redisconf,
// which this package cannot import), round after round while the killed
// master's replica is promoted. The other master's share of every batch
// must be answered as if nothing happened; the dead master's share fails
// (for its callers to repeat) until the batches follow the new slot map to
// the promoted replica, after which it is answered again. Each counter ends
// at the number of increments answered (the replica has the ones before
// the kill): none ran without its caller knowing, none ran twice.
func TestClusterBatchAfterFailover(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 1)
	ctx := context.Background()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), DisableIdentity: true, ContextTimeoutEnabled: true,
		ClusterStateReloadInterval: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	dead := cl.MasterFor(t, "{f}a")
	other := ""
	for i := range 1000 {
		if k := fmt.Sprintf("{o%d}n", i); cl.MasterFor(t, k) != dead {
			other = k
			break
		}
	}
	keys := []string{"{f}a", "{f}b", other}
	answered := map[string]int{}
	h := &Hook{rdb: rdb, lanes: 1, maxBatch: 256}
	round := func() (failed []error) {
		batch := make([]*call, len(keys))
		for i, k := range keys {
			batch[i] = &call{inner: redis.NewCmd(ctx, "eval", `return redis.call('INCR', KEYS[1])`, 1, k),
				deadline: time.Now().Add(5 * time.Second)}
		}
		h.exec(batch, func(ctx context.Context, cmd redis.Cmder) error { return rdb.Process(ctx, cmd) }, nil)
		for i, c := range batch {
			if err := c.inner.Err(); err != nil {
				failed = append(failed, fmt.Errorf("%s: %w", keys[i], err))
				continue
			}
			answered[keys[i]]++
		}
		return failed
	}
	if failed := round(); len(failed) > 0 {
		t.Fatalf("before the failover: %v", failed)
	}
	// The replica has those increments before the kill (replication is
	// asynchronous): a write and WAIT on one connection to the master,
	// after them in its replication stream.
	conn := dead.Client(t).Conn()
	defer conn.Close()
	if err := conn.Set(ctx, "{f}sync", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Do(ctx, "wait", 1, 10000).Int(); err != nil || n < 1 {
		t.Fatalf("WAIT 1 on the master: %d replicas, %v", n, err)
	}

	dead.Stop()
	var failedRounds, otherFailed int
	recovered := false
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		failed := round()
		for _, err := range failed {
			if strings.HasPrefix(err.Error(), other+":") {
				otherFailed++
				t.Errorf("the other master's share of a batch failed: %v", err)
			}
		}
		if len(failed) == 0 {
			if failedRounds > 0 {
				recovered = true
				break
			}
			continue
		}
		if failedRounds++; failedRounds <= 3 {
			t.Logf("round failed while the master is down: %v", failed)
		}
	}
	if failedRounds == 0 {
		t.Fatal("no batch failed: the master's death was not seen")
	}
	if !recovered {
		t.Fatalf("the batches did not recover after the failover (%d rounds failed)", failedRounds)
	}
	t.Logf("%d rounds failed while the master was down or not yet promoted; then answered again", failedRounds)
	for _, k := range keys {
		n, err := rdb.Get(ctx, k).Int()
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		if n != answered[k] {
			t.Errorf("%s = %d after %d increments answered", k, n, answered[k])
		}
	}
}

// newClusterHook starts a Redis Cluster of three masters, with a node
// timeout longer than any test (a paused master is not marked failed, so
// the others serve on as they would during a short stall), and a cluster
// client with no read timeout of its own (only contexts bound its calls),
// autopipelined with opts, with the test script incr loaded on every
// master, and the client's command table loaded. All of it is closed at the
// test's end.
func newClusterHook(t *testing.T, opts Options) (*redistest.Cluster, *redis.ClusterClient, *Hook) {
	t.Helper()
	cl := redistest.StartCluster(t, 3, 0, "--cluster-node-timeout", "600000")
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), DisableIdentity: true,
		ContextTimeoutEnabled: true, ReadTimeout: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	h := Enable(rdb, opts)
	t.Cleanup(h.Close)
	ctx := context.Background()
	if err := incr.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	// The client looks up the commands' key positions once, on a node of
	// its choice: before any is paused.
	if err := rdb.Get(ctx, "warm").Err(); err != redis.Nil {
		t.Fatal(err)
	}
	return cl, rdb, h
}

// keysOn returns n keys with the prefix whose slots srv serves.
func keysOn(t *testing.T, rdb *redis.ClusterClient, srv *redistest.Server, prefix string, n int) []string {
	t.Helper()
	var keys []string
	for i := 0; len(keys) < n && i < 10000; i++ {
		k := fmt.Sprintf("{%s%d}n", prefix, i)
		node, err := rdb.MasterForKey(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		if node.Options().Addr == srv.Addr {
			keys = append(keys, k)
		}
	}
	if len(keys) < n {
		t.Fatalf("not %d keys of %s on %s", n, prefix, srv.Addr)
	}
	return keys
}

// runIncr runs incr on key in a goroutine of its own and returns where its
// reply will come: an error unless it is 1 (each test key is incremented
// once).
func runIncr(ctx context.Context, rdb redis.UniversalClient, key string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		n, err := incr.Run(ctx, rdb, []string{key}).Int()
		if err == nil && n != 1 {
			err = fmt.Errorf("%s: INCR answered %d, want 1", key, n)
		}
		ch <- err
	}()
	return ch
}

// checkCounters checks that each key was incremented once.
func checkCounters(t *testing.T, rdb *redis.ClusterClient, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if n, err := rdb.Get(context.Background(), k).Int(); err != nil || n != 1 {
			t.Errorf("%s = %d, %v; want 1 (its script run once)", k, n, err)
		}
	}
}

// gateHook holds every command naming key until open is closed. Added to a
// client after the batching hook, it sees what that hook sends alone.
type gateHook struct {
	key        string
	seen, open chan struct{}
	once       sync.Once
}

func newGateHook(key string) *gateHook {
	return &gateHook{key: key, seen: make(chan struct{}), open: make(chan struct{})}
}

func (g *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (g *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if slices.Contains(cmd.Args(), any(g.key)) {
			g.once.Do(func() { close(g.seen) })
			<-g.open
		}
		return next(ctx, cmd)
	}
}

// pendingCalls returns how many calls are queued, on every master.
func pendingCalls(h *Hook) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.pending)
	for _, qu := range h.masters {
		n += len(qu.pending)
	}
	return n
}

// TestPausedMasterHoldsOnlyItsCallers pauses master B (SIGSTOP: a host
// that hangs) of a cluster of three, holds the only lane with a call on
// master C, and queues calls on A and B behind it: as one batch, they would
// go to A and B at once. Once the held call goes on, A's callers must get
// their replies while B's still waits; once B resumes, B's caller gets its
// reply too, and every script has run once. Before, a batch's callers were
// all answered only when every master's share had returned: B held A's
// callers.
func TestPausedMasterHoldsOnlyItsCallers(t *testing.T) {
	cl, rdb, h := newClusterHook(t, Options{Lanes: 1})
	a, b, c := cl.Nodes[0], cl.Nodes[1], cl.Nodes[2]
	onA, onB, onC := keysOn(t, rdb, a, "a", 2), keysOn(t, rdb, b, "b", 1), keysOn(t, rdb, c, "c", 1)
	gate := newGateHook(onC[0])
	rdb.AddHook(gate)
	ctx := context.Background()

	b.Pause(t)
	held := runIncr(ctx, rdb, onC[0])
	waitClosed(t, gate.seen, "call on C at the gate")
	a1 := runIncr(ctx, rdb, onA[0])
	stuck := runIncr(ctx, rdb, onB[0])
	a2 := runIncr(ctx, rdb, onA[1])
	// Queued behind the held call (one batch to A and B), or sent already.
	waitFor(t, func() bool {
		_, commands := h.Stats()
		return pendingCalls(h) >= 3 || commands >= 4
	}, "calls on A and B queued or sent")
	close(gate.open)

	if err := waitErr(t, held, "the call on C"); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []<-chan error{a1, a2} {
		if err := waitErr(t, ch, "a call on A while B is paused"); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-stuck:
		t.Fatalf("the call on the paused master returned: %v", err)
	default:
	}
	b.Resume()
	if err := waitErr(t, stuck, "the call on B after it resumed"); err != nil {
		t.Fatal(err)
	}
	checkCounters(t, rdb, onA[0], onA[1], onB[0], onC[0])
	waitIdle(t, h)
}

// TestPausedMasterKeepsNoLaneFromOthers pauses master B of a cluster of
// three and sends B one call more than there are lanes: every lane could be
// taken by a batch to B. Calls on A and C sent after must still get their
// replies while B's wait; once B resumes, B's callers get theirs, and every
// script has run once. Before, the lanes served every master: the calls on
// A and C queued until B answered.
func TestPausedMasterKeepsNoLaneFromOthers(t *testing.T) {
	cl, rdb, h := newClusterHook(t, Options{})
	a, b, c := cl.Nodes[0], cl.Nodes[1], cl.Nodes[2]
	onA, onB, onC := keysOn(t, rdb, a, "a", 2), keysOn(t, rdb, b, "b", h.lanes+1), keysOn(t, rdb, c, "c", 1)
	ctx := context.Background()

	b.Pause(t)
	var stuck []<-chan error
	for _, k := range onB {
		stuck = append(stuck, runIncr(ctx, rdb, k))
	}
	waitFor(t, func() bool { batches, _ := h.Stats(); return batches >= int64(h.lanes) }, "batches to B on every lane")
	for _, k := range append(onA, onC...) {
		if err := waitErr(t, runIncr(ctx, rdb, k), "a call on A or C while B is paused"); err != nil {
			t.Fatal(err)
		}
	}
	for _, ch := range stuck {
		select {
		case err := <-ch:
			t.Fatalf("a call on the paused master returned: %v", err)
		default:
		}
	}
	b.Resume()
	for _, ch := range stuck {
		if err := waitErr(t, ch, "a call on B after it resumed"); err != nil {
			t.Fatal(err)
		}
	}
	checkCounters(t, rdb, append(append(onA, onB...), onC...)...)
	waitIdle(t, h)
}

// TestRedirectToPausedMasterHoldsOnlyItsCaller moves the slot of a key X
// from master A to master B (CLUSTER SETSLOT … NODE, the last step of a
// resharding) without the client knowing, and pauses B. Behind a held call
// on A, callers queue on A, X's among them, in one batch to A: A answers
// the others and refuses X (MOVED), which goes out again alone, to B. The
// others must get their replies while X's caller waits, the caller sending
// the batch included (the first queued); once B resumes, X's caller gets
// its reply, and every script has run once. Before, a batch's callers were
// answered once its last script, sent again or not, had returned.
func TestRedirectToPausedMasterHoldsOnlyItsCaller(t *testing.T) {
	cl, rdb, h := newClusterHook(t, Options{Lanes: 1})
	a, b := cl.Nodes[0], cl.Nodes[1]
	onA := keysOn(t, rdb, a, "a", 4)
	hold, x := onA[0], onA[1]
	ctx := context.Background()
	slot, err := rdb.ClusterKeySlot(ctx, x).Result()
	if err != nil {
		t.Fatal(err)
	}
	bID := redistest.NodeID(t, b)
	for _, s := range []*redistest.Server{b, a, cl.Nodes[2]} {
		if err := s.Client(t).Do(ctx, "cluster", "setslot", slot, "node", bID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Client(t).Get(ctx, x).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
		t.Fatalf("GET %s on A = %v, want MOVED", x, err)
	}
	gate := newGateHook(hold)
	rdb.AddHook(gate)

	b.Pause(t)
	held := runIncr(ctx, rdb, hold)
	waitClosed(t, gate.seen, "call on A at the gate")
	a1 := runIncr(ctx, rdb, onA[2])
	waitFor(t, func() bool { return pendingCalls(h) >= 1 }, "the first call queued on A")
	moved := runIncr(ctx, rdb, x)
	waitFor(t, func() bool { return pendingCalls(h) >= 2 }, "X queued on A")
	a2 := runIncr(ctx, rdb, onA[3])
	waitFor(t, func() bool { return pendingCalls(h) >= 3 }, "three calls queued on A")
	close(gate.open)

	for _, ch := range []<-chan error{held, a1, a2} {
		if err := waitErr(t, ch, "a call on A while X's redirection waits for B"); err != nil {
			t.Fatal(err)
		}
	}
	if batches, commands := h.Stats(); batches != 2 || commands != 4 {
		t.Fatalf("%d batches of %d commands; want the held call alone, then X with the others", batches, commands)
	}
	select {
	case err := <-moved:
		t.Fatalf("X, redirected to the paused master, returned: %v", err)
	default:
	}
	b.Resume()
	if err := waitErr(t, moved, "X after B resumed"); err != nil {
		t.Fatal(err)
	}
	checkCounters(t, rdb, onA...)
	waitIdle(t, h)
}
