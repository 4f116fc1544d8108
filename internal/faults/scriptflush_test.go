package faults

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// TestScriptFlush (issue 6 (d)) empties Redis's functions (FUNCTION FLUSH)
// and script cache (SCRIPT FLUSH) every 30ms while clients run operations:
// every call then meets a missing function at times and must load the
// library again, or fall back to the script (EVALSHA, EVAL after NOSCRIPT),
// without an error reaching a client and without running anything twice.
// The same with WAIT (a replica, WaitReplicas 1), whose script and WAIT go
// out in one pipeline and have their own fallback.
func TestScriptFlush(t *testing.T) {
	t.Parallel()
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		scriptFlush(t, srv, ledger.Options{})
	})
	t.Run("WAIT 1 replica", func(t *testing.T) {
		srv := redistest.Start(t)
		host, port, _ := net.SplitHostPort(srv.Addr)
		replica := redistest.Start(t, "--replicaof", host, port)
		waitReplicaOnline(t, srv.Client(t), replica.Client(t))
		scriptFlush(t, srv, ledger.Options{WaitReplicas: 1, WaitTimeout: time.Second})
	})
}

func scriptFlush(t *testing.T, srv *redistest.Server, opts ledger.Options) {
	direct := srv.Client(t)
	rdb := redis.NewClient(redisOptions(srv.Addr))
	pipe := withAutopipe(t, rdb) // as ledgerd: batched scripts meet NOSCRIPT too
	st := startStack(t, rdb, policyYAML(3*time.Second), opts)

	rec := newRecorder(effIrreversible, maxAttempts)
	dest := newDestination(true, 4)
	clients := newClients(t, 2, st.Addr, rec, dest)
	l := newLoad(dest, clients, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	finish := l.background(ctx, t, "sf")

	flushes := 0
	for end := time.Now().Add(time.Duration(scale(3, 5)) * time.Second); time.Now().Before(end); {
		// The library's functions first, the scripts (the EVALSHA way,
		// after an OOM refusal) too.
		if err := direct.FunctionFlush(ctx).Err(); err != nil {
			t.Fatalf("FUNCTION FLUSH: %v", err)
		}
		if err := direct.ScriptFlush(ctx).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		flushes++
		sleepCtx(ctx, 30*time.Millisecond)
	}
	opIDs := finish()

	v := l.verify(context.Background(), t, clients[0], opIDs)
	noscript := redisInfo(t, direct, "errorstats", "errorstat_NOSCRIPT:count=")
	// "ERR Function not found": the only ERR of this test.
	missing := redisInfo(t, direct, "errorstats", "errorstat_ERR:count=")
	calls, unknown := rec.counts()
	t.Logf("%d SCRIPT FLUSH; %d operations: %s; %s", flushes, len(opIDs), v, dest)
	t.Logf("ledger calls by the clients: %v, %d with an unknown outcome; Do errors retried: %s", calls, unknown, l.errors())
	batches, batched := pipe.Stats()
	t.Logf("scripts: the ledger asked for %d (%d failed), the autopipelining hook sent %d (EVAL after NOSCRIPT included) in %d batches; Redis answered NOSCRIPT %d times, a missing function %d times, and ran %d scripts",
		st.scripts.Load(), st.failed.Load(), batched, batches, noscript, missing, scriptRuns(t, direct))
	if scriptRuns(t, direct) != st.scripts.Load() {
		t.Errorf("Redis ran %d scripts for the ledger's %d: the NOSCRIPT fallback ran some twice", scriptRuns(t, direct), st.scripts.Load())
	}
	if noscript+missing == 0 {
		t.Errorf("no script call met NOSCRIPT or a missing function: the flushes tested nothing")
	}
	if st.failed.Load() > 0 || unknown > 0 || l.errorsBut("retries exhausted") > 0 {
		t.Errorf("the NOSCRIPT fallback should be invisible: %d script calls failed, %d calls with an unknown outcome, Do errors: %s",
			st.failed.Load(), unknown, l.errors())
	}
	rec.linearizable(t, false)
}

// waitReplicaOnline waits until the replica is in sync with the primary.
func waitReplicaOnline(t testing.TB, primary, replica *redis.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		info, err := primary.Info(context.Background(), "replication").Result()
		rinfo, rerr := replica.Info(context.Background(), "replication").Result()
		if err == nil && rerr == nil && strings.Contains(info, "state=online") && strings.Contains(rinfo, "master_link_status:up") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the replica did not come in sync within 30s")
}
