// Package agent runs agent loops whose side-effecting tool calls go through
// the operation ledger, and ends every run with a status instead of a panic.
//
// A run is a transcript and a loop of steps: the Runner asks the Model for
// a Turn, runs its tool calls in order (a mutating tool through client.Do,
// under an operation id made of the run id and the call id), appends their
// results, and asks again. It ends with exactly one status: "done",
// "step_limit", "deadline", "repetition" or "error". A run resumed from its
// transcript sends pending calls under the same ids, so nothing executes
// twice. It logs ids and digests, never arguments or results.
//
// docs/agent.md has the loop, the guards, resuming after a crash and the
// logging contract.
package agent
