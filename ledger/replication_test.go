package ledger

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestWaitReplicas makes every call wait for one replica: with the replica
// up, calls succeed; with it down, a write reports KindNotReplicated (it
// stands on the primary), so does a Lookup of what it wrote, and the same
// call repeated once the replica is back succeeds with the same outcome.
func TestWaitReplicas(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", portOf(primary.Addr))
	waitReplicated(t, primary)
	pol, _ := ParsePolicies([]byte(ledgertest.Policy))
	// Room for a replica slow to acknowledge on a busy machine; the write
	// made with the replica down waits this long once.
	l, err := New(primary.Client(t), Options{Policies: pol, WaitReplicas: 1, WaitTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	who := Principal{Tenant: "t", ID: "a"}
	req := ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"}
	first, err := l.Reserve(ctx, who, req)
	if err != nil || first.Decision != DecisionExecute {
		t.Fatalf("Reserve with the replica up = %v, %v", first, err)
	}
	if n, _ := replica.Client(t).Exists(ctx, l.keys.op("t", "op").all[0]).Result(); n != 1 {
		t.Fatal("the acknowledged write is not on the replica")
	}

	replica.Stop()
	_, err = l.Complete(ctx, who, CompleteRequest{OperationID: "op", FencingToken: first.Operation.FencingToken, Outcome: OutcomeSucceeded})
	var e *Error
	if KindOf(err) != KindNotReplicated || !asError(err, &e) || e.Replicas != 0 {
		t.Fatalf("Complete with the replica down = %v, want KindNotReplicated", err)
	}
	// The write stands on the primary: a ledger that does not wait reads it,
	// one that does refuses to show it before a replica has it.
	plain, err := New(primary.Client(t), Options{Policies: pol})
	if err != nil {
		t.Fatal(err)
	}
	if o, err := plain.Lookup(ctx, who, "op"); err != nil || o.State != StateSucceeded {
		t.Fatalf("Lookup without WaitReplicas = %+v, %v", o, err)
	}
	if o, err := l.Lookup(ctx, who, "op"); KindOf(err) != KindNotReplicated {
		t.Fatalf("Lookup with the replica down = %+v, %v; want KindNotReplicated", o, err)
	}

	replica.Restart(t)
	waitReplicated(t, primary)
	done, err := l.Complete(ctx, who, CompleteRequest{OperationID: "op", FencingToken: first.Operation.FencingToken, Outcome: OutcomeSucceeded})
	if err != nil || done.State != StateSucceeded {
		t.Fatalf("the same Complete once the replica is back = %+v, %v", done, err)
	}
	o, _ := l.Lookup(ctx, who, "op")
	if len(o.History) != 2 {
		t.Fatalf("history = %v: the repeated Complete left a trace", o.History)
	}
}

func portOf(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[i+1:]
		}
	}
	return addr
}

// waitReplicated waits until the primary has a connected replica.
func waitReplicated(t *testing.T, primary *redistest.Server) {
	t.Helper()
	c := primary.Client(t)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if n, err := c.Do(context.Background(), "WAIT", 1, 100).Int(); err == nil && n >= 1 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the replica never connected")
}

func asError(err error, e **Error) bool {
	x, ok := err.(*Error)
	if ok {
		*e = x
	}
	return ok
}

// TestWaitReplicasOnCluster: on Redis Cluster the WAIT goes to the master of
// the operation's slot, with the script, on one connection.
func TestWaitReplicasOnCluster(t *testing.T) {
	cl := redistest.SharedCluster(t)
	pol, _ := ParsePolicies([]byte(ledgertest.Policy))
	l, err := New(cl.Client(t), Options{Policies: pol, WaitReplicas: 1, WaitTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	who := Principal{Tenant: "wait-" + randomHex(4), ID: "a"}
	for i := range 20 {
		id := "op-" + itoa(int64(i))
		r, err := l.Reserve(ctx, who, ReserveRequest{OperationID: id, Tool: "payments.refund", PermitID: "p", Holder: "h"})
		if err != nil {
			t.Fatalf("Reserve %s: %v", id, err)
		}
		if _, err := l.Complete(ctx, who, CompleteRequest{OperationID: id, FencingToken: r.Operation.FencingToken, Outcome: OutcomeSucceeded}); err != nil {
			t.Fatalf("Complete %s: %v", id, err)
		}
	}
}

// TestWaitReplicasOnClusterAfterFailover: the WAIT path sends the script to
// the slot's master directly, from the cluster client's cached slot map.
// After a failover that map is behind and the old master (a replica now)
// answers MOVED: the ledger reloads the map and goes to the new master, so
// the caller sees no error.
func TestWaitReplicasOnClusterAfterFailover(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 1)
	cl.WaitReplicas(t, 3, 1)
	pol, _ := ParsePolicies([]byte(ledgertest.Policy))
	l, err := New(cl.Client(t), Options{Policies: pol, WaitReplicas: 1, WaitTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	who := Principal{Tenant: "t", ID: "a"}
	r, err := l.Reserve(ctx, who, ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"})
	if err != nil || r.Decision != DecisionExecute {
		t.Fatalf("Reserve = %v, %v", r, err)
	}

	// A manual failover: the master's replica takes over, without loss.
	old := cl.MasterFor(t, l.keys.op("t", "op").all[0])
	var replica *redistest.Server
	for _, s := range cl.Nodes {
		info, _ := s.Client(t).Info(ctx, "replication").Result()
		if strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+portOf(old.Addr)+"\r\n") {
			replica = s
		}
	}
	if replica == nil {
		t.Fatal("no replica of the operation's master")
	}
	if err := replica.Client(t).Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, _ := old.Client(t).Info(ctx, "replication").Result()
		if strings.Contains(info, "role:slave") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the failover did not happen within 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cl.WaitOK(t)

	o, err := l.Complete(ctx, who, CompleteRequest{OperationID: "op", FencingToken: r.Operation.FencingToken, Outcome: OutcomeSucceeded})
	if err != nil || o.State != StateSucceeded {
		t.Fatalf("Complete after the failover = %v, %v; want SUCCEEDED", o, err)
	}
	if o, err := l.Lookup(ctx, who, "op"); err != nil || o.State != StateSucceeded || len(o.History) != 2 {
		t.Fatalf("Lookup = %v, %v", o, err)
	}
}

// TestWaitCoversTheStateRead: with WaitReplicas, a call whose script writes
// nothing (a Reserve answering EXECUTE again to its holder, or REPLAY; a
// repeated Complete; a Lookup) still sends the replicas a write before its
// WAIT, so that the WAIT covers the state the script read, which another
// connection may have written a moment before. (From Redis 7.2 on, WAIT
// waits for the replication offset of the connection's last command that
// propagated: without a write of its own, such a call would be acknowledged
// at once with that state on no replica. internal/faults
// TestWaitCoversWhatAnswersRest shows the outcome with a stalled replica.)
func TestWaitCoversTheStateRead(t *testing.T) {
	primary := redistest.Start(t)
	redistest.Start(t, "--replicaof", "127.0.0.1", portOf(primary.Addr))
	waitReplicated(t, primary)
	pol, _ := ParsePolicies([]byte(ledgertest.Policy))
	l, err := New(primary.Client(t), Options{Policies: pol, WaitReplicas: 1, WaitTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admin := primary.Client(t)
	// changes is the primary's count of writes (each one propagated to the
	// replicas); REPLCONF GETACK, which a WAIT may send, is not one.
	changes := func() int64 {
		info, err := admin.Info(ctx, "persistence").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "rdb_changes_since_last_save:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no rdb_changes_since_last_save")
		return 0
	}
	who := Principal{Tenant: "t", ID: "a"}
	req := ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"}
	first, err := l.Reserve(ctx, who, req)
	if err != nil {
		t.Fatal(err)
	}
	done := CompleteRequest{OperationID: "op", FencingToken: first.Operation.FencingToken, Outcome: OutcomeSucceeded}
	calls := []struct {
		name string
		call func() error
	}{
		{"Reserve (EXECUTE again)", func() error { _, err := l.Reserve(ctx, who, req); return err }},
		{"Lookup", func() error { _, err := l.Lookup(ctx, who, "op"); return err }},
		{"Complete", func() error { _, err := l.Complete(ctx, who, done); return err }},
		{"Complete (repeated)", func() error { _, err := l.Complete(ctx, who, done); return err }},
		{"Reserve (REPLAY)", func() error { _, err := l.Reserve(ctx, who, req); return err }},
	}
	for _, c := range calls {
		before := changes()
		if err := c.call(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if changes() == before {
			t.Errorf("%s sent the replicas nothing before its WAIT: the WAIT did not cover the state it read", c.name)
		}
	}
}

// TestWaitMarkerRedirectedAfterTheScript: with WaitReplicas on Redis
// Cluster, a call's script, the SET of its WAIT marker and WAIT go to the
// slot's master in one pipeline, but Redis may serve other clients between
// them (a pipeline read in several parts). When a resharding closes the
// slot in between, the script has run and the marker's SET is answered
// MOVED: that redirection is not the script's, and the script must not be
// sent again to the new master. The call is answered KindUnavailable (the
// write stands; nothing says a replica has it), the caller repeats it and
// gets the same outcome, and Redis ran the script once for the first call.
// The claim that script made is reported (EventTransition) for the first
// call, whose answer is an error, and for no other: the repeats make none,
// and a repeat's script answered MOVED did not run.
func TestWaitMarkerRedirectedAfterTheScript(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	cc := cl.Client(t)
	// Once armed, the next WAIT pipeline is sent in two parts, the slot
	// moved between them.
	var armed atomic.Bool
	var moveSlot func()
	cc.OnNewNode(func(n *redis.Client) { n.AddHook(splitHook{armed: &armed, between: func() { moveSlot() }}) })
	pol, _ := ParsePolicies([]byte(ledgertest.Policy))
	// No replica: every call waits its 10 ms and reports KindNotReplicated;
	// what matters here is what runs.
	var tl transitionLog
	l, err := New(cc, Options{Policies: pol, Observer: tl.observe, WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	key := l.keys.op("t", "op").all[0]
	slot, err := cc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	src := cl.MasterFor(t, key)
	dst := cl.Nodes[0]
	if dst == src {
		dst = cl.Nodes[1]
	}
	masters := []*redistest.Server{src, dst}
	// moveSlot moves the slot with its keys from src to dst, as redis-cli
	// --cluster reshard does.
	moveSlot = func() {
		s, d := src.Client(t), dst.Client(t)
		srcID, dstID := redistest.NodeID(t, src), redistest.NodeID(t, dst)
		do := func(c interface {
			Do(context.Context, ...any) *redis.Cmd
		}, args ...any) {
			if err := c.Do(ctx, args...).Err(); err != nil {
				t.Errorf("%v: %v", args, err)
			}
		}
		do(d, "cluster", "setslot", slot, "importing", srcID)
		do(s, "cluster", "setslot", slot, "migrating", dstID)
		host, port, _ := strings.Cut(dst.Addr, ":")
		for {
			ks, err := s.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
			if err != nil || len(ks) == 0 {
				break
			}
			args := []any{"migrate", host, port, "", 0, 5000, "keys"}
			for _, k := range ks {
				args = append(args, k)
			}
			do(s, args...)
		}
		do(d, "cluster", "setslot", slot, "node", dstID)
		do(s, "cluster", "setslot", slot, "node", dstID)
		for _, m := range cl.Nodes {
			if m != src && m != dst {
				do(m.Client(t), "cluster", "setslot", slot, "node", dstID)
			}
		}
	}
	evalshas := func() int64 {
		var n int64
		for _, s := range masters {
			info, err := s.Client(t).Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(info, "\r\n") {
				if rest, ok := strings.CutPrefix(line, "cmdstat_fcall:calls="); ok {
					v, _, _ := strings.Cut(rest, ",")
					c, _ := strconv.ParseInt(v, 10, 64)
					n += c
				}
			}
		}
		return n
	}

	who := Principal{Tenant: "t", ID: "a"}
	req := ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"}
	before := evalshas()
	armed.Store(true)
	_, err = l.Reserve(ctx, who, req)
	ran := evalshas() - before
	if armed.Load() {
		t.Fatal("the WAIT pipeline was not split: the test tested nothing")
	}
	if ran != 1 {
		t.Errorf("Redis ran the first Reserve's script %d times, want 1: the marker's MOVED was taken for the script's", ran)
	}
	if KindOf(err) != KindUnavailable {
		t.Errorf("Reserve with its marker redirected: %v (kind %v), want KindUnavailable", err, KindOf(err))
	}
	const claimed = "UNSPECIFIED>RUNNING:RESERVED"
	if got := tl.list(); got != claimed {
		t.Errorf("transitions reported for the Reserve with its marker redirected: %q, want %q", got, claimed)
	}
	// The caller repeats the call: the ledger goes to the new master, where
	// the first run's claim is, and answers it again (not replicated: no
	// replica here). The record holds one claim.
	for range 20 {
		if _, err = l.Reserve(ctx, who, req); KindOf(err) != KindUnavailable {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if KindOf(err) != KindNotReplicated {
		t.Fatalf("Reserve repeated: %v, want KindNotReplicated", err)
	}
	plain, err := New(cc, Options{Policies: pol})
	if err != nil {
		t.Fatal(err)
	}
	if o, err := plain.Lookup(ctx, who, "op"); err != nil || o.State != StateRunning || o.Attempt != 1 || len(o.History) != 1 {
		t.Fatalf("Lookup = %+v, %v; want RUNNING, attempt 1, one claim", o, err)
	}
	if got := tl.list(); got != claimed {
		t.Errorf("transitions reported after the repeats: %q, want %q (once)", got, claimed)
	}
}

// splitHook sends the first WAIT pipeline (script, marker, WAIT) it sees
// once armed in two parts, the script first, and calls between in
// between.
type splitHook struct {
	armed   *atomic.Bool
	between func()
}

func (h splitHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h splitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h splitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) != 3 || cmds[2].Name() != "wait" || !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmds)
		}
		err := next(ctx, cmds[:1])
		h.between()
		if err2 := next(ctx, cmds[1:]); err == nil {
			err = err2
		}
		return err
	}
}

// transitionLog is an Observer that keeps the transitions it is told of.
type transitionLog struct {
	mu   sync.Mutex
	seen []string
}

func (tl *transitionLog) observe(e Event) {
	if e.Type != EventTransition {
		return
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.seen = append(tl.seen, e.From.String()+">"+e.To.String()+":"+e.Reason)
}

// list returns the transitions seen so far, in order.
func (tl *transitionLog) list() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return strings.Join(tl.seen, " ")
}

// unreplicated returns two ledgers on one fresh redis-server without a
// replica: l, with observe and WaitReplicas 1, whose every call answers
// KindNotReplicated after its script ran, and plain, without either, to read
// the store.
func unreplicated(t *testing.T, observe Observer) (l, plain *Ledger) {
	t.Helper()
	primary := redistest.Start(t)
	pol, _ := ParsePolicies([]byte(ledgertest.Policy))
	l, err := New(primary.Client(t), Options{Policies: pol, Observer: observe, WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	plain, err = New(primary.Client(t), Options{Policies: pol})
	if err != nil {
		t.Fatal(err)
	}
	return l, plain
}

// TestTransitionsReportedWhenNotReplicated: with WaitReplicas and no replica
// every call answers KindNotReplicated, but its write stands on the primary:
// the transition it made is reported, once (its repeat, answered the same,
// makes none).
func TestTransitionsReportedWhenNotReplicated(t *testing.T) {
	var tl transitionLog
	l, plain := unreplicated(t, tl.observe)
	ctx := context.Background()
	who := Principal{Tenant: "t", ID: "a"}
	req := ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"}
	// The claim's token, read from the store after the Reserve (its answer
	// is an error).
	done := CompleteRequest{OperationID: "op", Outcome: OutcomeSucceeded}
	steps := []struct {
		name string
		call func() error
		want string // the transitions seen after the call
		st   State  // the record's state after the call
	}{
		{"Reserve", func() error { _, err := l.Reserve(ctx, who, req); return err }, "UNSPECIFIED>RUNNING:RESERVED", StateRunning},
		{"Reserve repeated", func() error { _, err := l.Reserve(ctx, who, req); return err }, "UNSPECIFIED>RUNNING:RESERVED", StateRunning},
		{"Complete", func() error { _, err := l.Complete(ctx, who, done); return err },
			"UNSPECIFIED>RUNNING:RESERVED RUNNING>SUCCEEDED:SUCCEEDED", StateSucceeded},
		{"Complete repeated", func() error { _, err := l.Complete(ctx, who, done); return err },
			"UNSPECIFIED>RUNNING:RESERVED RUNNING>SUCCEEDED:SUCCEEDED", StateSucceeded},
	}
	for _, s := range steps {
		if err := s.call(); KindOf(err) != KindNotReplicated {
			t.Fatalf("%s: %v, want KindNotReplicated", s.name, err)
		}
		o, err := plain.Lookup(ctx, who, "op")
		if err != nil || o.State != s.st {
			t.Fatalf("after %s: Lookup = %+v, %v; want %v", s.name, o, err, s.st)
		}
		done.FencingToken = o.FencingToken
		if got := tl.list(); got != s.want {
			t.Errorf("after %s the transitions reported are %q, want %q", s.name, got, s.want)
		}
	}
}

// TestTransitionsReportedWhenTheMarkerIsRefused: with WaitReplicas, a
// call's script runs and then the SET of the shard's WAIT marker is
// refused (here: an ACL user whose key patterns cover every key of the
// ledger but the marker's). The call answers the marker's error, as it
// did, but the transition its script made stands in the store, and the
// caller's repeat (refused the same way) makes none: the ledger reports it
// for the call that made it, once, so the metrics count it. A first
// pipeline whose script did not run (NOSCRIPT, the script then sent again
// with EVAL) reports nothing of its own. And the sweeper counts an expired
// claim it made UNKNOWN although the marker after it was refused.
func TestTransitionsReportedWhenTheMarkerIsRefused(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client(t)
	// Every key of the layout (keys.go) but the marker, <prefix>:{sNN}:wait.
	rules := ACLRules(DefaultPrefix)
	all := "~" + DefaultPrefix + ":*"
	if !strings.Contains(rules, all) {
		t.Fatalf("ACLRules %q has no %s to narrow", rules, all)
	}
	var patterns []string
	for _, k := range []string{":op:*", ":unresolved:*", ":leases", ":stats", ":overdue"} {
		patterns = append(patterns, "~"+DefaultPrefix+":{s??}"+k)
	}
	srv.CreateUser(t, "nomarker", "nomarker-password", strings.Replace(rules, all, strings.Join(patterns, " "), 1))
	pol, _ := ParsePolicies([]byte(ledgertest.Policy))
	var tl transitionLog
	l, err := New(srv.UserClient(t, "nomarker", "nomarker-password"), Options{Policies: pol, Observer: tl.observe, WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New(admin, Options{Policies: pol})
	if err != nil {
		t.Fatal(err)
	}
	who := Principal{Tenant: "t", ID: "a"}
	req := ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"}
	// The claim's token, read from the store after the Reserve (its answer
	// is an error).
	done := CompleteRequest{OperationID: "op", Outcome: OutcomeSucceeded}
	refused := func(name string, err error) {
		t.Helper()
		// The marker's refusal, answered as before (a script error).
		if KindOf(err) != KindOther || !strings.Contains(err.Error(), "NOPERM") {
			t.Fatalf("%s: %v (kind %v), want the marker's NOPERM as KindOther", name, err, KindOf(err))
		}
	}
	steps := []struct {
		name    string
		call    func() error
		flushed bool   // SCRIPT FLUSH before the call: its first EVALSHA does not run
		want    string // the transitions seen after the call
		st      State  // the record's state after the call
	}{
		{"Reserve", func() error { _, err := l.Reserve(ctx, who, req); return err }, true, "UNSPECIFIED>RUNNING:RESERVED", StateRunning},
		{"Reserve repeated", func() error { _, err := l.Reserve(ctx, who, req); return err }, false, "UNSPECIFIED>RUNNING:RESERVED", StateRunning},
		{"Complete", func() error { _, err := l.Complete(ctx, who, done); return err }, true,
			"UNSPECIFIED>RUNNING:RESERVED RUNNING>SUCCEEDED:SUCCEEDED", StateSucceeded},
		{"Complete repeated", func() error { _, err := l.Complete(ctx, who, done); return err }, false,
			"UNSPECIFIED>RUNNING:RESERVED RUNNING>SUCCEEDED:SUCCEEDED", StateSucceeded},
	}
	for _, s := range steps {
		if s.flushed {
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		refused(s.name, s.call())
		o, err := plain.Lookup(ctx, who, "op")
		if err != nil || o.State != s.st {
			t.Fatalf("after %s: Lookup = %+v, %v; want %v: the script did not run", s.name, o, err, s.st)
		}
		done.FencingToken = o.FencingToken
		if got := tl.list(); got != s.want {
			t.Errorf("after %s the transitions reported are %q, want %q", s.name, got, s.want)
		}
	}

	// An irreversible claim past its lease: the sweeper's expire script
	// makes it UNKNOWN, and the marker after it is refused.
	before := tl.list()
	exp := ReserveRequest{OperationID: "exp", Tool: "expiring.charge", PermitID: "p", Holder: "h"}
	_, err = l.Reserve(ctx, who, exp)
	refused("Reserve expiring.charge", err)
	if got, want := tl.list(), strings.TrimSpace(before+" UNSPECIFIED>RUNNING:RESERVED"); got != want {
		t.Fatalf("after Reserve expiring.charge the transitions reported are %q, want %q", got, want)
	}
	var n int
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Nothing is swept before the lease ends in the store's time.
		if n, err = l.Sweep(ctx); err != nil || n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweeper found no expired claim within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	refused("Sweep", err)
	if n != 1 {
		t.Errorf("Sweep = %d operations made UNKNOWN, want 1", n)
	}
	if o, err := plain.Lookup(ctx, who, "exp"); err != nil || o.State != StateUnknown {
		t.Fatalf("after Sweep: Lookup = %+v, %v; want UNKNOWN", o, err)
	}
	want := strings.TrimSpace(before + " UNSPECIFIED>RUNNING:RESERVED RUNNING>UNKNOWN:LEASE_EXPIRED")
	if got := tl.list(); got != want {
		t.Errorf("after Sweep the transitions reported are %q, want %q", got, want)
	}
	// The claim left the lease index: the next pass finds nothing.
	if n, err := l.Sweep(ctx); n != 0 || err != nil {
		t.Errorf("Sweep again = %d, %v; want 0, nil", n, err)
	}
	if got := tl.list(); got != want {
		t.Errorf("after a second Sweep the transitions reported are %q, want %q", got, want)
	}
}

// TestReconciledReportedWhenNotReplicated: a Reconcile whose script records
// the finding and whose WAIT then falls short (KindNotReplicated) reports
// the finding (EventReconciled, which ledger_reconciliations_total counts)
// for that call, once: the caller's repeat, answered the same, records
// nothing and reports nothing.
func TestReconciledReportedWhenNotReplicated(t *testing.T) {
	var mu sync.Mutex
	var findings []Finding
	l, plain := unreplicated(t, func(e Event) {
		if e.Type == EventReconciled {
			mu.Lock()
			findings = append(findings, e.Finding)
			mu.Unlock()
		}
	})
	ctx := context.Background()
	who := Principal{Tenant: "t", ID: "a"}
	r, err := plain.Reserve(ctx, who, ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.MarkUnknown(ctx, who, MarkUnknownRequest{OperationID: "op", FencingToken: r.Operation.FencingToken}); err != nil {
		t.Fatal(err)
	}
	req := ReconcileRequest{OperationID: "op", Finding: FindingApplied, Result: &Result{ResourceID: "re-1"}}
	for _, call := range []string{"Reconcile", "Reconcile repeated"} {
		if _, err := l.Reconcile(ctx, who, req); KindOf(err) != KindNotReplicated {
			t.Fatalf("%s: %v, want KindNotReplicated", call, err)
		}
		o, err := plain.Lookup(ctx, who, "op")
		if err != nil || o.State != StateSucceeded {
			t.Fatalf("after %s: Lookup = %+v, %v; want SUCCEEDED", call, o, err)
		}
		mu.Lock()
		n := len(findings)
		mu.Unlock()
		if n != 1 {
			t.Errorf("after %s: %d findings reported, want 1 (the call whose script recorded it)", call, n)
		}
	}
}
