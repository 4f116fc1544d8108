// Package faults is the fault suite of the ledger (issue 6): it runs the
// service under the faults real deployments see and checks that nothing is
// applied twice and no acknowledged record is lost.
//
// Every test drives the service with the Go SDK (client.Do, with a
// reconciler) against a fake destination that is not idempotent and counts
// its effects per operation id, so a duplicate would show; it also fails a
// share of the attempts on purpose (ambiguous, retryable, final). The
// faults:
//
//   - TestRedisKill (a): kill -9 of redis-server (appendonly yes,
//     appendfsync always) under load, then restart: every acknowledged
//     Reserve, Complete, MarkUnknown and Reconcile is in the store, crashed
//     agents' RUNNING and UNKNOWN operations survive and resolve (S7), no
//     operation ran twice.
//   - TestLedgerdKill (b): kill -9 of a ledgerd process under load, restart
//     on the same port; clients retry; abandoned claims become UNKNOWN
//     (sweeper) and are reconciled (S7).
//   - TestSeveralInstances: three ledgerd processes on one Redis, each with
//     its own sweeper and compaction pass, killed -9 one at a time under
//     load while the others serve; the same operations are performed at
//     once through different instances (S1, S9), clients pinned to an
//     instance retry it and a round-robin client fails over; agents that
//     crash at once leave claims the three sweepers race to expire (each
//     expiry recorded once, by principal "ledger"), a reconciler on
//     another instance resolves them; the live counts behind the
//     unresolved gauges match the records, and short-lived receipts are
//     cut to their tombstones and refused as expired.
//   - TestNetworkFaults (c): an in-process toxiproxy between the ledger and
//     Redis: latency past the read timeout, reset_peer, cut replies, silent
//     drops, down and up; go-redis re-sends EVALSHA, nothing is applied
//     twice.
//   - TestScriptFlush (d): SCRIPT FLUSH during a load run (the NOSCRIPT
//     path), with and without WAIT.
//   - TestClusterFailover (e) and TestSentinelFailover: a master killed and
//     its replica promoted, after a plain crash and after a partition of
//     the replication link; acknowledged writes lost with and without WAIT.
//   - TestClusterReshard: slots moved between the masters of a cluster
//     under load, key by key as redis-cli --cluster reshard moves them,
//     and to a master added mid-run; every call on a shard whose slot is
//     open is refused by Redis (ASK, TRYAGAIN) and answered UNAVAILABLE,
//     never another error; the live counts summed over the masters match
//     the records. The compaction pass runs meanwhile and cuts receipts
//     to their tombstones, each on one master, each run once. Once without
//     WAIT, and once with WAIT 1 on a cluster with a replica per master
//     (the ledger's EVALSHA, marker SET and WAIT pipelines on moving
//     slots).
//
// The tests that run the ledger in the test process (TestRedisKill,
// TestNetworkFaults, TestScriptFlush, TestClusterFailover,
// TestSentinelFailover, TestClusterReshard) set up its go-redis client as
// ledgerd does, with the same code (internal/redisconf): the caller's
// deadline bounds each Redis call, a Cluster client reloads its slot map
// every second, and concurrent scripts are batched (internal/autopipe), so
// that batches meet the killed server, the network faults, NOSCRIPT, the
// dead master and the moving slots too. The hook batches nothing with
// WAIT: each call then sends its script, the WAIT marker and WAIT in a
// pipeline of its own.
//
// The histories of every test (every ledger RPC the clients made, faults
// included) are checked for linearizability with porcupine against a model
// of the contract's state machine (model_test.go; TestModel checks the model
// itself). docs/failure-model.md has the figures and what they mean.
//
// Run it alone with `go test -race -count=1 ./internal/faults/` (about three
// minutes). It needs redis-server and redis-cli, and builds
// cmd/ledgerd once. With LEDGER_TEST_FAULTS=long the runs are longer (12
// Redis kills, 12 ledgerd kills in each ledgerd test, the network fault
// schedule 5 times) and TestRedisKill also measures appendfsync everysec
// and no persistence.
package faults
