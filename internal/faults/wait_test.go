package faults

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// TestWaitCoversWhatAnswersRest: with WaitReplicas 1, no answer that lets a
// caller run its tool (EXECUTE) or trust what the record says (REPLAY, a
// repeated Complete, IN_PROGRESS, a Lookup) is acknowledged while the state
// it rests on is not on the replica.
//
// The replica stays connected but receives nothing more (a proxy drops its
// replication stream), as behind a stalled link: its primary still counts
// it, with the offset it last acknowledged. A first ledger's writes are then
// refused NOT_REPLICATED; a second ledger (another ledgerd, other
// connections) repeats the calls, which find that state and write nothing
// of their own, and looks the operation up. Then the replica is promoted and
// the first caller repeats its Reserve: its tool must have run once, and
// every answer acknowledged before the failover must still be true on the
// promoted replica.
//
// A Lookup that did not wait failed this. The calls that write nothing are
// covered on every Redis version only because the ledger writes a marker
// before each WAIT (ledger TestWaitCoversTheStateRead): Redis before 7.2,
// as here, moves a connection's WAIT offset with any command; later
// versions only with one that propagates.
func TestWaitCoversWhatAnswersRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary := redistest.Start(t)
	proxy := newFaultProxy(t, primary.Addr)
	host, port, _ := net.SplitHostPort(proxy.Addr())
	replica := redistest.Start(t, "--replicaof", host, port)
	waitReplicaOnline(t, primary.Client(t), replica.Client(t))
	pol, err := ledger.ParsePolicies([]byte(policyYAML(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	newLedger := func(rdb *redis.Client, wait int) *ledger.Ledger {
		l, err := ledger.New(rdb, ledger.Options{Policies: pol, WaitReplicas: wait, WaitTimeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// Two ledger instances on the primary, each with its own connections.
	first, second := newLedger(primary.Client(t), 1), newLedger(primary.Client(t), 1)
	who := ledger.Principal{Tenant: "t", ID: "agent"}

	// The fake destination: how many times each operation's tool ran. A
	// caller runs it on an acknowledged EXECUTE only; NOT_REPLICATED is
	// "unknown, repeat the same call", as the SDK treats it.
	runs := map[string]int{}
	// Every acknowledged answer, with the record it showed.
	type answer struct {
		call string
		op   *ledger.Operation
	}
	var acked []answer
	note := func(call string, op *ledger.Operation, err error) error {
		switch {
		case err == nil:
			acked = append(acked, answer{call, op})
			t.Logf("%s: acknowledged, %v attempt %d", call, op.State, op.Attempt)
		case ledger.KindOf(err) == ledger.KindNotReplicated:
			t.Logf("%s: NOT_REPLICATED", call)
		default:
			t.Fatalf("%s: %v", call, err)
		}
		return err
	}
	reserve := func(l *ledger.Ledger, call, id, holder string) *ledger.ReserveResult {
		r, err := l.Reserve(ctx, who, ledger.ReserveRequest{OperationID: id, Tool: "payments.refund", PermitID: "p", Holder: holder})
		var op *ledger.Operation
		if r != nil {
			op = r.Operation
		}
		if note(fmt.Sprintf("%s (%v)", call, decisionOf(r)), op, err) == nil && r.Decision == ledger.DecisionExecute {
			runs[id]++
		}
		return r
	}
	complete := func(l *ledger.Ledger, call string, token uint64) {
		op, err := l.Complete(ctx, who, ledger.CompleteRequest{OperationID: "done", FencingToken: token,
			Outcome: ledger.OutcomeSucceeded, Result: &ledger.Result{ResourceID: "refund-1"}})
		note(call, op, err)
	}

	// "done" is claimed while the replica is in sync: acknowledged. On a
	// busy machine the replica may still miss the 200ms WAIT; the caller
	// then repeats the same call, as the SDK does with NOT_REPLICATED, and
	// gets the same claim.
	var claimed *ledger.ReserveResult
	for try := 1; claimed == nil; try++ {
		if try > 50 {
			t.Fatal("Reserve of done with the replica in sync: NOT_REPLICATED 50 times")
		}
		claimed = reserve(first, "Reserve done", "done", "h1")
	}
	if claimed.Decision != ledger.DecisionExecute || claimed.Operation.Attempt != 1 {
		t.Fatalf("Reserve of done with the replica in sync = %v attempt %d, want EXECUTE attempt 1", claimed.Decision, claimed.Operation.Attempt)
	}

	// From here on the replica gets nothing.
	proxy.toxic(t, "stall", "timeout", "downstream", 1, `{"timeout":0}`)

	if r := reserve(first, "Reserve new (first ledger)", "new", "h1"); r != nil {
		t.Fatalf("the Reserve that creates new was acknowledged (%v) though the replica cannot have it", r.Decision)
	}
	reserve(second, "Reserve new again, same holder (second ledger)", "new", "h1")
	reserve(second, "Reserve new, another holder (second ledger)", "new", "h2")
	op, err := second.Lookup(ctx, who, "new")
	note("Lookup new (second ledger)", op, err)
	complete(first, "Complete done (first ledger)", claimed.Operation.FencingToken)
	reserve(second, "Reserve done again (second ledger)", "done", "h1")
	complete(second, "Complete done again (second ledger)", claimed.Operation.FencingToken)

	// The failover: the stale replica takes over, the primary dies.
	if err := replica.Client(t).Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	primary.Stop()
	after := newLedger(replica.Client(t), 0)
	// The caller whose Reserve of new was never acknowledged repeats it.
	if r := reserve(after, "Reserve new after the failover", "new", "h1"); r == nil || r.Decision != ledger.DecisionExecute {
		t.Fatalf("Reserve of new after the failover = %v, want EXECUTE", r)
	}
	if runs["new"] != 1 {
		t.Errorf("the tool of new ran %d times, want once", runs["new"])
	}
	for _, a := range acked {
		now, err := after.Lookup(ctx, who, a.op.ID)
		switch {
		case err != nil:
			t.Errorf("%s was acknowledged (%v attempt %d); after the failover: %v", a.call, a.op.State, a.op.Attempt, err)
		case now.Attempt != a.op.Attempt || now.FencingToken != a.op.FencingToken,
			(a.op.State == ledger.StateSucceeded || a.op.State == ledger.StateFailedFinal) && now.State != a.op.State:
			t.Errorf("%s was acknowledged (%v attempt %d token %d); after the failover the record is %v attempt %d token %d",
				a.call, a.op.State, a.op.Attempt, a.op.FencingToken, now.State, now.Attempt, now.FencingToken)
		}
	}
}

func decisionOf(r *ledger.ReserveResult) any {
	if r == nil {
		return "no decision"
	}
	return r.Decision
}
