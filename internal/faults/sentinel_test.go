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

// TestSentinelFailover measures the same as TestClusterFailover's second
// failover on a primary, one replica and a Sentinel: the replication link
// cut, writes going on, the primary killed and the stale replica promoted by
// Sentinel. Without WAIT the figures are logged; with WAIT 1 no acknowledged
// answer may be lost (a write's, and a read's: a Lookup, IN_PROGRESS or
// REPLAY shows only what the replica has) and nothing may run twice.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	for _, wait := range []int{0, 1} {
		t.Run(fmt.Sprintf("WAIT %d", wait), func(t *testing.T) {
			t.Parallel()
			sentinelFailover(t, wait)
		})
	}
}

func sentinelFailover(t *testing.T, wait int) {
	primary := redistest.Start(t)
	host, port, _ := net.SplitHostPort(primary.Addr)
	replica := redistest.Start(t, "--replicaof", host, port)
	waitReplicaOnline(t, primary.Client(t), replica.Client(t))
	sentinel := redistest.StartSentinel(t, primary, "faults")
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr, DisableIdentity: true})
	t.Cleanup(func() { _ = sc.Close() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r, err := sc.Replicas(context.Background(), "faults").Result(); err == nil && len(r) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sentinel did not find the replica")
		}
	}
	// As ledgerd sets up its Sentinel client (cmd/ledgerd, openStore),
	// autopipelining on.
	rdb := failoverClient("faults", []string{sentinel.Addr})
	pipe := withAutopipe(t, rdb)
	st := startStack(t, rdb, policyYAML(3*time.Second), ledger.Options{WaitReplicas: wait, WaitTimeout: 100 * time.Millisecond})

	rec := newRecorder(effIrreversible, maxAttempts)
	rec.answers = wait > 0
	dest := newDestination(true, 6)
	clients := newClients(t, 2, st.Addr, rec, dest)
	l := newLoad(dest, clients, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	finish := l.background(ctx, t, "sn")

	sleepCtx(ctx, time.Second)
	cutReplication(t, primary, replica)
	sleepCtx(ctx, time.Second)
	primary.Stop()
	at := l.done.Load()
	deadline := time.Now().Add(30 * time.Second)
	for role(t, replica) != "master" {
		if time.Now().After(deadline) {
			t.Fatal("Sentinel did not promote the replica within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A new replica of the new primary replaces the dead one, so writes can
	// be acknowledged again. (Not the old primary restarted: it would come
	// back as an empty primary until someone demotes it, and if Sentinel,
	// slowed down on a busy machine, had not yet finished its failover, it
	// could make the promoted replica sync from that empty primary and wipe
	// every record: the hazard Redis's documentation warns of for primaries
	// without persistence that restart automatically.)
	nhost, nport, _ := net.SplitHostPort(replica.Addr)
	fresh := redistest.Start(t, "--replicaof", nhost, nport)
	// The records are looked up once it is in sync: a Lookup with WAIT
	// answers only with a replica.
	waitReplicaOnline(t, replica.Client(t), fresh.Client(t))
	shown := 0
	lost, _ := lostAcks(ctx, t, clients[0], rec.acknowledged(), func(s string) {
		if shown++; shown <= 5 {
			t.Log(s)
		}
	})
	t.Logf("failover (replication cut for 1s, then kill -9 of the primary, after %d operations settled): %d acknowledged writes lost", at, lost)
	after := settledAfter(ctx, t, l)
	opIDs := finish()
	checkUnavailableOnly(t, rec, l, lost)

	fail := t.Errorf
	if wait == 0 {
		fail = func(format string, args ...any) {
			if shown++; shown <= 10 {
				t.Logf(format, args...)
			}
		}
	}
	v := l.check(context.Background(), t, clients[0], opIDs, fail)
	acked := len(rec.acknowledged())
	calls, unknown := rec.counts()
	t.Logf("ledger calls by the clients: %v, %d with an unknown outcome (%v); Do errors retried: %s", calls, unknown, rec.unknownWhy(), l.errors())
	violations := rec.violations(t, true)
	batches, batched := pipe.Stats()
	t.Logf("MEASURED Sentinel, WAIT %d: %d acknowledged writes checked, %d lost; %d calls NOT_REPLICATED; %d operations (%d settled after the failover): %s; %d not linearizable; autopipelining: %d scripts in %d batches",
		wait, acked, lost, rec.unknownWhy()["NOT_REPLICATED"], len(opIDs), after, v, violations, batched, batches)
	if wait > 0 && (lost > 0 || v.duplicates > 0 || violations > 0) {
		t.Errorf("with WAIT %d: %d acknowledged writes lost, %d duplicate effects, %d operations not linearizable; want none", wait, lost, v.duplicates, violations)
	}
	if v.unsettled > 0 {
		t.Errorf("%d operations did not settle", v.unsettled)
	}
}
