package autopipe

import (
	"context"
	"fmt"
	"strings"
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
	h.exec(batch, func(ctx context.Context, cmd redis.Cmder) error { return rdb.Process(ctx, cmd) })

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
		h.exec(batch, func(ctx context.Context, cmd redis.Cmder) error { return rdb.Process(ctx, cmd) })
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
