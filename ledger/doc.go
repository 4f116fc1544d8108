// Package ledger is the operation ledger's domain: the state machine that
// makes an agent's side-effecting tool calls safe to retry, stored in Redis.
//
// # The model
//
// An operation is one logical action an agent wants to perform, named by the
// caller's stable operation id (scoped to a tenant) and bound, when it is
// first reserved, to its tool, its permit and the fingerprint of its
// consequential parameters (SHA-256 of their RFC 8785 canonical JSON; the
// parameters themselves are never stored). A retry reuses the id; a new
// intent gets a new id. The same id with another tool, permit or fingerprint
// is refused (KindKeyReused): a key must never replay an old receipt for a
// changed request.
//
// Each operation moves through five states (docs/design.md has the full
// table):
//
//	Reserve, no record            -> RUNNING (attempt 1, a new fencing token)
//	Reserve, PENDING              -> RUNNING (attempt + 1, a new token), or
//	                                 FAILED_FINAL when attempts are exhausted
//	Reserve, RUNNING past lease   -> UNKNOWN for irreversible tools; reclaimed
//	                                 (RUNNING, attempt + 1) for idempotent ones
//	Complete(succeeded)           -> SUCCEEDED, with the result
//	Complete(failed final)        -> FAILED_FINAL, with the failure
//	Complete(failed retryable)    -> PENDING (proven not applied)
//	MarkUnknown                   -> UNKNOWN
//	Reconcile(applied)            -> SUCCEEDED, with the result
//	Reconcile(not applied)        -> PENDING
//	Reconcile(abandon)            -> FAILED_FINAL
//	Reconcile(escalate)           -> UNKNOWN, flagged for human review
//	sweeper, RUNNING past lease   -> UNKNOWN (irreversible tools)
//
// Reserve decides: EXECUTE (the caller holds the claim: attempt and fencing
// token), REPLAY (terminal: the recorded result or failure), IN_PROGRESS
// (another holder's live lease) or RECONCILE (nobody knows whether the effect
// happened; for an irreversible tool a human or a reconciler must ask the
// destination before anything runs again). Each claim increments the
// attempt and the fencing token; Complete, MarkUnknown and Renew must carry
// the current token, so a worker whose claim was taken over cannot
// overwrite the outcome. Reconcile may carry the token of the attempt its
// finding is about, so a late or repeated finding never resolves the next
// attempt. The holder, a random id per call, lets a caller
// whose Reserve response was lost recover its own claim.
//
// # Storage
//
// Every state change is one Lua script (scripts/*.lua, each documenting its
// KEYS, ARGV and returns): atomic, with no read-modify-write from Go, and
// safe to run twice (go-redis re-sends EVALSHA after a read timeout), since
// each script recognises its own earlier effect. All keys of one operation and
// the indexes its transitions maintain share one hash tag (see keyspace), so
// every script runs unchanged on Redis Cluster. Times come from the store's
// clock (TIME), the one clock shared by every ledger instance.
//
// Non-terminal records never expire. A terminal record lives for
// max(retention, retain_until + grace) and leaves a tombstone that outlives
// it, so a late replay from a queue is reported (KindKeyExpired) instead of
// executed again. The compaction pass (Compactor, RunCompactor) cuts each
// terminal record to that tombstone (fingerprint and final state) when its
// retention ends, keeping the key's TTL. The sweeper (Sweep, RunSweeper) turns abandoned
// irreversible claims into UNKNOWN without anyone retrying them, and
// ListUnresolved pages through what needs attention.
//
// The package speaks its own types and *Error values; the gRPC edge lives in
// package server.
package ledger
