package faults

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// TestClusterReshard moves slots between the masters of a Redis Cluster
// under load, key by key as redis-cli --cluster reshard does, and to a
// fourth master added mid-run, with the compaction pass and the sweeper
// running; once without WAIT and once with WAIT 1. Then: nothing applied
// twice, every call Redis refused answered UNAVAILABLE, every acknowledged
// write kept, every operation settled, no script run twice, the live counts
// equal to the records, every receipt compacted on one master, and the
// history linearizable (failure-model.md, "Resharding").
func TestClusterReshard(t *testing.T) {
	for _, wait := range []int{0, 1} {
		t.Run(fmt.Sprintf("WAIT %d", wait), func(t *testing.T) { clusterReshard(t, wait) })
	}
}

func clusterReshard(t *testing.T, wait int) {
	cl := redistest.StartCluster(t, 3, wait)
	// As ledgerd sets up its cluster client (cmd/ledgerd, openStore).
	rdb := clusterClient(cl.Addrs())
	rd := newRedirects()
	rdb.OnNewNode(func(n *redis.Client) { n.AddHook(nodeHook{rd}) })
	withAutopipe(t, rdb)
	rdb.AddHook(clusterHook{rd}) // after autopipe's: it sees each script once, batched or not
	// Receipts are kept 1 s once settled, so that the compaction passes
	// have records to cut while the slots move.
	policy := policyYAML(2*time.Second) + "tools:\n  - match: " + receiptTool + "\n    retention: 1s\n    tombstone_retention: 1h\n"
	st := startStack(t, rdb, policy, ledger.Options{WaitReplicas: wait, WaitTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := st.Ledger.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}

	rec := newRecorder(effIrreversible, maxAttempts)
	rec.answers = wait > 0
	dest := newDestination(true, 11)
	clients := newClients(t, 3, st.Addr, rec, dest)
	crashed := crashAgents(ctx, t, clients, dest, "crash", scale(24, 2))
	reconciler := newClient(t, st.Addr, rec, dest)
	stopRec := reconcileInBackground(ctx, t, reconciler, dest)
	l := newLoad(dest, clients, 6)
	finish := l.background(ctx, t, "rs")
	rcpt := newReceiptsOn(t, []string{st.Addr, st.Addr}, dest)
	stopReceipts := rcpt.performInBackground(ctx, t, 200*time.Millisecond)
	// The compaction pass, as ledgerd runs it (--compact-batch), with a
	// shorter tick; its commands are told apart in the figures.
	cctx, stopCompactor := context.WithCancel(context.WithValue(ctx, compactionCtx{}, true))
	compactorDone := make(chan struct{})
	go func() { st.Ledger.RunCompactor(cctx, 100*time.Millisecond, 25); close(compactorDone) }()
	defer func() { stopCompactor(); <-compactorDone }()

	// The shards' slots, in shard order, each once; half as many with WAIT,
	// whose moves take longer (twice the nodes on the same cores).
	shards := scale(32, 2)
	if wait > 0 {
		shards /= 2
	}
	var slots []int
	seenSlot := map[int]bool{}
	for s := range shards {
		slot, err := rdb.ClusterKeySlot(ctx, fmt.Sprintf("%s:{s%02d}:stats", ledger.DefaultPrefix, s)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !seenSlot[int(slot)] {
			seenSlot[int(slot)] = true
			slots = append(slots, int(slot))
		}
	}
	half := len(slots) / 2

	// 1: between the first three masters.
	sleepCtx(ctx, 2*time.Second)
	var masters []*redistest.Server
	for _, n := range cl.Nodes {
		if role(t, n) == "master" {
			masters = append(masters, n)
		}
	}
	compactedBefore, passesBefore := st.compacted.Load(), st.compactPasses.Load()
	var moved reshardFigures
	for _, slot := range slots[:half] {
		src := slotOwner(t, cl, slot)
		dst := masters[(indexOf(masters, src)+1)%len(masters)]
		moved.add(moveSlot(ctx, t, masters, slot, src, dst))
	}
	t.Logf("phase 1: %d slots moved between the 3 masters, %d keys, after %d operations settled", moved.slots, moved.keys, l.done.Load())

	// 2: a new master joins, and slots move to it.
	added := cl.AddMaster(t)
	masters = append(masters, added)
	if wait > 0 {
		// Its replica, before any slot is its: WAIT counts the master's
		// replicas.
		cl.AddReplica(t, added)
	}
	var toAdded reshardFigures
	for _, slot := range slots[half:] {
		toAdded.add(moveSlot(ctx, t, masters, slot, slotOwner(t, cl, slot), added))
	}
	compactedMoving, passesMoving := st.compacted.Load()-compactedBefore, st.compactPasses.Load()-passesBefore
	t.Logf("phase 2: master %s added, %d slots moved to it, %d keys, after %d operations settled", added.Addr, toAdded.slots, toAdded.keys, l.done.Load())
	sleepCtx(ctx, time.Second)

	for id := range crashed {
		waitSettledOrPending(ctx, t, reconciler, id)
	}
	reconciled, staleFindings := stopRec()
	nReceipts := stopReceipts()
	opIDs := finish()

	nodes := make([]*redis.Client, len(masters))
	for i, m := range masters {
		nodes[i] = m.Client(t)
	}
	all := append(append([]string(nil), opIDs...), keys(crashed)...)
	checkLiveCounts(ctx, t, nodes, reconciler, nil, all, "while the crashed agents' operations wait")
	resolveCrashed(ctx, t, clients[0], dest, crashed)

	v := l.verify(context.Background(), t, reconciler, opIDs)
	checkLiveCounts(ctx, t, nodes, reconciler, nil, all, "at the end")
	if p, err := reconciler.ListUnresolved(ctx, client.ListOptions{PageSize: 1000}); err != nil {
		t.Fatal(err)
	} else if len(p.Operations) > 0 || p.NextPageToken != "" {
		t.Errorf("ListUnresolved at the end: %d operations, next page %q, want none", len(p.Operations), p.NextPageToken)
	}
	lost, checked := lostAcks(ctx, t, reconciler, rec.acknowledged(), func(s string) { t.Error(s) })
	if n := owned(t, cl, added); n != len(slots)-half {
		t.Errorf("the added master serves %d slots, want %d", n, len(slots)-half)
	}
	// The compaction passes cut records while the slots moved, and every
	// receipt is cut to its tombstone, on one master, in the end.
	if compactedMoving == 0 {
		t.Errorf("the compaction passes cut no record while the slots moved (%d walks ended meanwhile): they tested nothing", passesMoving)
	}
	cutFirst := rcpt.check(ctx, t, nodes)

	// What the callers saw: a call whose outcome they could not tell was
	// answered UNAVAILABLE, which the SDK repeats, or ended by the caller
	// itself (its deadline, or the SDK cancelling a lease renewal once the
	// tool returned); no other error.
	why := rec.unknownWhy()
	for reason, n := range why {
		switch reason {
		case "STORE_UNAVAILABLE", "DeadlineExceeded", "Canceled":
		case "NOT_REPLICATED":
			if wait == 0 {
				t.Errorf("%d ledger calls failed with %s without WAIT", n, reason)
			}
		default:
			t.Errorf("%d ledger calls failed with %s; a slot on the move must answer UNAVAILABLE (STORE_UNAVAILABLE)", n, reason)
		}
	}
	if n := l.errorsBut("unavailable", "retries exhausted"); n > 0 {
		t.Errorf("Do failed %d times with other errors than UNAVAILABLE and retries exhausted: %s", n, l.errors())
	}
	// A script is run once per time the ledger sends it: a refusal of
	// another script in the same pipeline must not send it again.
	if n := rd.ranTwice(); n > 0 {
		t.Errorf("%d scripts the ledger sent once were run more than once by Redis", n)
	}
	if rd.scripts() == 0 {
		t.Error("no script was redirected or refused: the slots did not move under the load")
	}
	// A compaction pass skips a key whose slot is elsewhere (that master's
	// walk finds it): meeting a slot on the move is no failure.
	if n := st.compactFailed.Load(); n > 0 {
		t.Errorf("%d pipelines of the compaction passes failed", n)
	}
	if rd.calls("compaction") == 0 {
		t.Error("no command of the compaction passes was redirected or refused: they did not meet a slot on the move")
	}

	calls, unknown := rec.counts()
	total := 0
	for _, n := range calls {
		total += n
	}
	t.Logf("%d operations: %s; %s", len(opIDs), v, dest)
	t.Logf("%d crashed agents' claims resolved, %d findings of the reconciler accepted (%d refused STALE_FENCING_TOKEN); acknowledged writes checked %v, lost %d", len(crashed), reconciled, staleFindings, checked, lost)
	t.Logf("ledger calls by the clients: %v, %d with an unknown outcome (%v); Do errors retried: %s", calls, unknown, why, l.errors())
	t.Logf("MEASURED WAIT %d: %d slots moved under load (%d keys, MIGRATE %d at a time), %d of them to a master added mid-run (%d keys); Redis %s; ledger scripts %d, %d failed; client calls %d, %d answered UNAVAILABLE (%d NOT_REPLICATED); Do errors retried: %s; %d operations of the load: %s; %d crashed agents' operations resolved; compaction: %d records cut while the slots moved (%d walks over a master's keys ended meanwhile), %d pipelines of which %d failed; %d receipts, each cut to its tombstone (%d at the first look) and refused as expired when performed again",
		wait, moved.slots+toAdded.slots, moved.keys+toAdded.keys, migrateBatch, toAdded.slots, toAdded.keys, rd,
		st.scripts.Load(), st.failed.Load(), total, why["STORE_UNAVAILABLE"], why["NOT_REPLICATED"], l.errors(), len(opIDs), v, len(crashed),
		compactedMoving, passesMoving, st.compactions.Load(), st.compactFailed.Load(), nReceipts, cutFirst)
	rec.linearizable(t, false)
}

// compactionCtx marks the context of the compaction pass, so that
// redirects tells its commands apart.
type compactionCtx struct{}

// migrateBatch is how many keys one MIGRATE moves, and migratePause the
// pause after each: slow enough that scripts meet the slot half moved.
const (
	migrateBatch = 1
	migratePause = 30 * time.Millisecond
)

type reshardFigures struct{ slots, keys int }

func (f *reshardFigures) add(keys int) { f.slots++; f.keys += keys }

// moveSlot moves slot from src to dst as redis-cli --cluster reshard does,
// migrateBatch keys at a time, and returns how many keys it moved.
func moveSlot(ctx context.Context, t testing.TB, masters []*redistest.Server, slot int, src, dst *redistest.Server) int {
	t.Helper()
	srcID, dstID := redistest.NodeID(t, src), redistest.NodeID(t, dst)
	s, d := src.Client(t), dst.Client(t)
	do := func(c *redis.Client, args ...any) {
		t.Helper()
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%s: %v: %v", c.Options().Addr, args, err)
		}
	}
	do(d, "cluster", "setslot", slot, "importing", srcID)
	do(s, "cluster", "setslot", slot, "migrating", dstID)
	host, port, _ := strings.Cut(dst.Addr, ":")
	n := 0
	for {
		ks, err := s.ClusterGetKeysInSlot(ctx, slot, migrateBatch).Result()
		if err != nil {
			t.Fatalf("CLUSTER GETKEYSINSLOT %d: %v", slot, err)
		}
		if len(ks) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range ks {
			args = append(args, k)
		}
		do(s, args...)
		n += len(ks)
		sleepCtx(ctx, migratePause)
	}
	// The target first, then the source (from then on it answers MOVED),
	// then every other master.
	do(d, "cluster", "setslot", slot, "node", dstID)
	do(s, "cluster", "setslot", slot, "node", dstID)
	for _, m := range masters {
		if m != src && m != dst {
			do(m.Client(t), "cluster", "setslot", slot, "node", dstID)
		}
	}
	return n
}

// slotRanges returns the slot ranges each master serves, by address
// (CLUSTER SHARDS of the first node).
func slotRanges(t testing.TB, cl *redistest.Cluster) map[string][]redis.SlotRange {
	t.Helper()
	shards, err := cl.Nodes[0].Client(t).ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]redis.SlotRange{}
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				addr := fmt.Sprintf("%s:%d", n.IP, n.Port)
				out[addr] = append(out[addr], sh.Slots...)
			}
		}
	}
	return out
}

// slotOwner returns the master serving slot.
func slotOwner(t testing.TB, cl *redistest.Cluster, slot int) *redistest.Server {
	t.Helper()
	for addr, ranges := range slotRanges(t, cl) {
		for _, r := range ranges {
			if int(r.Start) <= slot && slot <= int(r.End) {
				for _, s := range cl.Nodes {
					if s.Addr == addr {
						return s
					}
				}
			}
		}
	}
	t.Fatalf("no master serves slot %d", slot)
	return nil
}

// owned returns how many slots s serves.
func owned(t testing.TB, cl *redistest.Cluster, s *redistest.Server) int {
	t.Helper()
	n := 0
	for _, r := range slotRanges(t, cl)[s.Addr] {
		n += int(r.End - r.Start + 1)
	}
	return n
}

func indexOf(ss []*redistest.Server, s *redistest.Server) int {
	for i, x := range ss {
		if x == s {
			return i
		}
	}
	return -1
}

// redirects counts the replies of the cluster's nodes that say a slot is
// on the move (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) and the NOSCRIPT replies
// of a node without the scripts, and what became of the commands that got
// one, the ledger's scripts apart from the compaction pass's and from the
// other commands (the sweeper's, the list's and the stats' reads): go-redis
// follows a redirection and retries TRYAGAIN itself, and gives up after a
// few tries (MaxRedirects). A node's hook sees every reply; the cluster
// client's hook sees each command's outcome, and with WAIT, where the
// ledger sends its pipelines to the nodes itself, the node's reply is the
// outcome.
type redirects struct {
	mu      sync.Mutex
	replies map[string]int         // node replies by kind
	seen    map[redis.Cmder]string // commands in flight that got one
	runs    map[redis.Cmder]int    // the scripts' runs, by the ledger's command
	twice   int                    // scripts that the ledger sent once and Redis ran more than once
	// markerRedirected counts the ledger's WAIT pipelines whose script ran
	// and whose marker's SET was then redirected (the slot closed between
	// the two).
	markerRedirected int
	byClass          map[string]*redirected // "scripts", "compaction", "other commands"
}

// redirected is what became of the commands of one class that got a reply
// redirects counts.
type redirected struct {
	calls    int            // commands that got one
	answered int            // ... that were answered in the end
	resent   int            // ... that a node without the script answered NOSCRIPT in the end
	ended    map[string]int // ... that ended in an error, by its kind
}

func newRedirects() *redirects {
	return &redirects{replies: map[string]int{}, seen: map[redis.Cmder]string{}, runs: map[redis.Cmder]int{},
		byClass: map[string]*redirected{"scripts": {ended: map[string]int{}}, "compaction": {ended: map[string]int{}}, "other commands": {ended: map[string]int{}}}}
}

var movingKinds = []string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "NOSCRIPT"}

// kindOf is the kind of a reply error that redirects counts ("" for
// others).
func kindOf(err error) string {
	if err == nil {
		return ""
	}
	word, _, _ := strings.Cut(err.Error(), " ")
	for _, k := range movingKinds {
		if word == k {
			return k
		}
	}
	return ""
}

func isScript(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "fcall", "evalsha", "eval", "evalsha_ro", "eval_ro":
		return true
	}
	return false
}

func classOf(ctx context.Context, cmd redis.Cmder) string {
	switch {
	case ctx.Value(compactionCtx{}) != nil:
		return "compaction"
	case isScript(cmd):
		return "scripts"
	}
	return "other commands"
}

// ran reports whether a script's reply says Redis ran it: a success, or
// the script's own error. A redirection, NOSCRIPT or a network error says
// it did not, or nothing.
func ran(err error) bool {
	var rerr redis.Error
	return kindOf(err) == "" && (err == nil || errors.As(err, &rerr))
}

func (r *redirects) reply(ctx context.Context, cmd redis.Cmder, err error) {
	k := kindOf(err)
	r.mu.Lock()
	defer r.mu.Unlock()
	if k == "" {
		if isScript(cmd) && ran(err) {
			if r.runs[cmd]++; r.runs[cmd] == 2 {
				r.twice++
			}
		}
		return
	}
	r.replies[k]++
	if k == "NOSCRIPT" {
		return // the script is sent again (EVAL) as another command
	}
	if _, ok := r.seen[cmd]; !ok {
		r.seen[cmd] = classOf(ctx, cmd)
		r.byClass[classOf(ctx, cmd)].calls++
	}
}

// waitPipeline takes the replies of one of the ledger's WAIT pipelines
// (its script, the SET of the WAIT marker, WAIT), sent by the ledger to a
// node itself, and counts those whose script ran but whose marker's SET
// was redirected: the call is then answered UNAVAILABLE, and the script
// is not sent again (ledger TestWaitMarkerRedirectedAfterTheScript).
func (r *redirects) waitPipeline(cmds []redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(cmds) == 3 && isScript(cmds[0]) && ran(cmds[0].Err()) && kindOf(cmds[1].Err()) != "" {
		r.markerRedirected++
	}
}

func (r *redirects) outcome(cmd redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	class, ok := r.seen[cmd]
	if !ok {
		return
	}
	delete(r.seen, cmd)
	c := r.byClass[class]
	if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
		k := kindOf(err)
		if k == "NOSCRIPT" {
			c.resent++ // Script.Run sends it again as EVAL
			return
		}
		if k == "" {
			k = "other: " + err.Error()
		}
		c.ended[k]++
		return
	}
	c.answered++
}

// ranTwice returns how many scripts Redis ran more than once.
func (r *redirects) ranTwice() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.twice
}

// scripts returns how many of the ledger's scripts got a reply redirects
// counts.
func (r *redirects) scripts() int { return r.calls("scripts") }

// calls returns how many commands of class got a reply redirects counts.
func (r *redirects) calls(class string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byClass[class].calls
}

func (r *redirects) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for _, k := range movingKinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.replies[k]))
	}
	s := "replies " + strings.Join(parts, ", ") + fmt.Sprintf("; scripts run more than once: %d; WAIT markers redirected after their script ran: %d", r.twice, r.markerRedirected)
	for _, class := range []string{"scripts", "compaction", "other commands"} {
		c := r.byClass[class]
		var ended []string
		n := 0
		for k, e := range c.ended {
			ended = append(ended, fmt.Sprintf("%s %d", k, e))
			n += e
		}
		sort.Strings(ended)
		s += fmt.Sprintf("; %s: %d redirected or refused, %d of them answered after go-redis followed or retried them, %d answered NOSCRIPT (then sent as EVAL), %d ended in an error", class, c.calls, c.answered, c.resent, n)
		if n > 0 {
			s += " (" + strings.Join(ended, ", ") + ")"
		}
	}
	return s
}

// nodeHook is redirects' hook on each node's client.
type nodeHook struct{ r *redirects }

func (h nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.r.reply(ctx, cmd, err)
		return err
	}
}

func (h nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.r.reply(ctx, c, c.Err())
		}
		waitPipe := len(cmds) > 0 && cmds[len(cmds)-1].Name() == "wait"
		if waitPipe {
			h.r.waitPipeline(cmds)
		}
		if waitPipe || ctx.Value(compactionCtx{}) != nil {
			// The ledger's WAIT pipeline, or the compaction pass's: the
			// ledger sends them to the node itself, and the cluster client
			// never sees them. The node's replies are the outcome.
			for _, c := range cmds {
				h.r.outcome(c)
			}
		}
		return err
	}
}

// clusterHook is redirects' hook on the cluster client.
type clusterHook struct{ r *redirects }

func (h clusterHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h clusterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil {
			cmd.SetErr(err)
		}
		h.r.outcome(cmd)
		return err
	}
}

func (h clusterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.r.outcome(c)
		}
		return err
	}
}
