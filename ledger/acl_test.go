package ledger

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redisconf"
	"github.com/opledger/ledger/internal/redistest"
)

// aclCycle runs, as the ledger's restricted Redis user, what ledgerd runs
// against Redis: the scripts' first load, a Reserve, Complete and Lookup
// (and a retry of the completed operation, which must not execute the
// effect again), a lease that expires and the sweeper that moves it to
// UNKNOWN, ListUnresolved, and a compaction pass that cuts a completed
// record past its retention to its tombstone. prefix keeps the run's keys
// apart from every other test's, so the pass and the sweep see only them.
func aclCycle(t *testing.T, rdb redis.UniversalClient, prefix string, opts Options) {
	t.Helper()
	pol, err := ParsePolicies([]byte(ledgertest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	opts.Prefix, opts.Policies = prefix, pol
	l, err := New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	who := Principal{Tenant: "acl-" + randomHex(4), ID: "agent-1"}
	applied := 0 // effects the destination applied
	reserve := func(id, tool string) *ReserveResult {
		t.Helper()
		r, err := l.Reserve(ctx, who, ReserveRequest{OperationID: id, Tool: tool, Params: map[string]any{"amount": 10.0}, Holder: "h-" + id, PermitID: "permit-1"})
		if err != nil {
			t.Fatalf("Reserve(%s): %v", id, err)
		}
		if r.Decision == DecisionExecute {
			applied++
		}
		return r
	}

	// Reserve, Complete, Lookup; the retry replays the result.
	r := reserve("pay-1", "payments.refund")
	if r.Decision != DecisionExecute {
		t.Fatalf("Reserve = %v, want EXECUTE", r.Decision)
	}
	if _, err := l.Complete(ctx, who, CompleteRequest{OperationID: "pay-1", FencingToken: r.Operation.FencingToken, Outcome: OutcomeSucceeded, Result: &Result{Data: []byte(`{"refund":"re_1"}`)}}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if o, err := l.Lookup(ctx, who, "pay-1"); err != nil || o.State != StateSucceeded {
		t.Fatalf("Lookup = %v, %v; want SUCCEEDED", o, err)
	}
	if r := reserve("pay-1", "payments.refund"); r.Decision != DecisionReplay {
		t.Fatalf("retry of a completed operation = %v, want REPLAY", r.Decision)
	}
	if applied != 1 {
		t.Fatalf("the effect was applied %d times, want 1", applied)
	}

	// A lease that expires: the sweeper makes it UNKNOWN, ListUnresolved
	// lists it.
	reserve("lease-1", "expiring.tool")
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := l.Sweep(ctx)
		if err != nil {
			t.Fatalf("Sweep: %v", err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweeper never moved the expired lease")
		}
		time.Sleep(20 * time.Millisecond)
	}
	page, err := l.ListUnresolved(ctx, who, ListRequest{States: []State{StateUnknown}})
	if err != nil {
		t.Fatalf("ListUnresolved: %v", err)
	}
	if len(page.Operations) != 1 || page.Operations[0].ID != "lease-1" {
		t.Fatalf("ListUnresolved(UNKNOWN) = %v, want lease-1", page.Operations)
	}

	// A completed record past its retention: the compaction pass cuts it.
	c := reserve("compact-1", "compact.tool")
	if _, err := l.Complete(ctx, who, CompleteRequest{OperationID: "compact-1", FencingToken: c.Operation.FencingToken, Outcome: OutcomeSucceeded}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	compactor := l.NewCompactor(0)
	for compacted := 0; compacted == 0; {
		st, err := compactor.Pass(ctx)
		if err != nil {
			t.Fatalf("compaction pass: %v", err)
		}
		compacted += st.Compacted
		if compacted == 0 && time.Now().After(deadline) {
			t.Fatal("the compaction pass never cut the record past its retention")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The tombstone still refuses a late replay.
	if r, err := l.Reserve(ctx, who, ReserveRequest{OperationID: "compact-1", Tool: "compact.tool", Params: map[string]any{"amount": 10.0}, Holder: "h-late", PermitID: "permit-1"}); KindOf(err) != KindKeyExpired {
		t.Fatalf("a late replay of a compacted operation = %v, %v; want IDEMPOTENCY_KEY_EXPIRED", r, err)
	}
	if applied != 3 {
		t.Fatalf("the effects were applied %d times, want 3 (one per operation)", applied)
	}

	// A run: its steps counted, the next one past its cap refused, its
	// operation settled, the run ended and listed.
	if _, err := l.StartRun(ctx, who, "run-1", RunLimits{MaxSteps: 1, Deadline: time.Minute}); err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	step := func(id string) (*ReserveResult, error) {
		return l.Reserve(ctx, who, ReserveRequest{OperationID: id, Tool: "payments.refund", Holder: "h-" + id, RunID: "run-1"})
	}
	s1, err := step("run-1-a")
	if err != nil {
		t.Fatalf("Reserve in the run: %v", err)
	}
	if _, err := step("run-1-b"); KindOf(err) != KindRunEnded {
		t.Fatalf("a step past the cap: %v, want KindRunEnded", err)
	}
	if _, err := l.Complete(ctx, who, CompleteRequest{OperationID: "run-1-a", FencingToken: s1.Operation.FencingToken, Outcome: OutcomeSucceeded}); err != nil {
		t.Fatalf("Complete in the run: %v", err)
	}
	if r, err := l.GetRun(ctx, who, "run-1"); err != nil || r.State != RunStateStepLimit || r.Open != 0 {
		t.Fatalf("GetRun = %+v, %v", r, err)
	}
	if _, err := l.StartRun(ctx, who, "run-2", RunLimits{}); err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	if _, err := l.EndRun(ctx, who, "run-2", RunStateDone, "done"); err != nil {
		t.Fatalf("EndRun: %v", err)
	}
	if page, err := l.ListRuns(ctx, who, 0, ""); err != nil || len(page.Runs) != 2 {
		t.Fatalf("ListRuns = %+v, %v", page, err)
	}
}

// TestACLRulesCluster: the documented Redis Cluster user (ClusterACLRules,
// created on every node as docs/security.md writes it) runs the ledger as
// ledgerd's --redis-mode cluster does, with --wait-replicas.
func TestACLRulesCluster(t *testing.T) {
	cl := redistest.SharedCluster(t)
	// The cluster outlives the test (-count=N reruns it): a user and keys
	// of this run.
	run := randomHex(4)
	prefix, user := "aclc"+run, "ledger-"+run
	for _, n := range cl.Nodes {
		n.CreateUser(t, user, "acl-cluster-password", ClusterACLRules(prefix))
	}
	o := &redis.ClusterOptions{Addrs: cl.Addrs(), Username: user, Password: "acl-cluster-password"}
	redisconf.Cluster(o)
	cc := redis.NewClusterClient(o)
	t.Cleanup(func() { _ = cc.Close() })
	aclCycle(t, cc, prefix, Options{WaitReplicas: 1, WaitTimeout: 2 * time.Second})
	for _, n := range cl.Nodes {
		n.RequireNoACLDenials(t, user)
	}
}

// TestACLRulesSentinel: behind Redis Sentinel (--redis-mode sentinel) the
// master's user is the single server's (ACLRules), and the sentinels'
// user, when they have ACLs, needs only SentinelACLRules: the ledger runs
// through both as ledgerd does.
func TestACLRulesSentinel(t *testing.T) {
	master := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, master, "aclmaster")
	master.CreateUser(t, "ledger", "acl-master-password", ACLRules("acls"))
	sentinel.CreateUser(t, "ledger-sentinel", "acl-sentinel-password", SentinelACLRules())
	o := &redis.FailoverOptions{
		MasterName:    "aclmaster",
		SentinelAddrs: []string{sentinel.Addr},
		Username:      "ledger", Password: "acl-master-password",
		SentinelUsername: "ledger-sentinel", SentinelPassword: "acl-sentinel-password",
	}
	redisconf.Failover(o)
	fc := redis.NewFailoverClient(o)
	t.Cleanup(func() { _ = fc.Close() })
	aclCycle(t, fc, "acls", Options{})
	// go-redis pings its subscription to the sentinel (+switch-master)
	// after 3 s without a message: wait for that ping too.
	deadline := time.Now().Add(30 * time.Second)
	for !pinged(t, sentinel, "ledger-sentinel") {
		if time.Now().After(deadline) {
			t.Fatal("the subscription to the sentinel never pinged it")
		}
		time.Sleep(100 * time.Millisecond)
	}
	master.RequireNoACLDenials(t, "ledger")
	sentinel.RequireNoACLDenials(t, "ledger-sentinel")
}

// pinged reports whether a connection of user to s subscribed to channels
// ran PING last (CLIENT LIST; a refused PING counts too, and noDenials
// then finds it).
func pinged(t *testing.T, s *redistest.Server, user string) bool {
	t.Helper()
	list, err := s.Client(t).ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST on %s: %v", s.Addr, err)
	}
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if slices.Contains(f, "user="+user) && slices.Contains(f, "cmd=ping") && !slices.Contains(f, "sub=0") {
			return true
		}
	}
	return false
}
