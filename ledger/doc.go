// Package ledger is the operation ledger's domain: the state machine that
// makes an agent's side-effecting tool calls safe to retry, stored in Redis.
//
// An operation is named by the caller's stable operation id within a tenant
// and bound, at its first Reserve, to its tool, permit and the fingerprint
// of its consequential parameters. Reserve decides: EXECUTE (the caller
// holds the claim: an attempt and a fencing token), REPLAY, IN_PROGRESS or
// RECONCILE. Complete, MarkUnknown and Renew carry the claim's token;
// Reconcile records what the destination says. Every state change is one
// Lua script (scripts/*.lua), safe to run twice; the sweeper and the
// compaction pass keep leases and retention moving.
//
// docs/contract.md is the contract; docs/design.md has the state machine,
// the key layout and the reasoning behind both. The gRPC edge is package
// server.
package ledger
