// Package agent runs agent loops whose side-effecting tool calls go through
// the operation ledger, and ends every run with a status instead of a panic.
//
// # The model
//
// A run is a transcript ([]Message) and a loop of steps. Each step is one
// model turn: the Runner hands the transcript to the Model, which answers
// with a Turn: either tool calls (each with a call id, a tool name and
// JSON-like arguments) or, with no calls, the final answer. The Runner
// appends the turn to the transcript as an assistant Message, runs the calls
// one after the other in the order given, appends one tool Message (a
// ToolResult) per call, and asks the model again. Tool errors are data: a
// tool that fails gives the model a ToolResult with Error set, and the run
// goes on; the model decides what to do next.
//
// # Statuses
//
// Run never panics and never returns a Go error: it returns an Outcome whose
// Status is exactly one of
//
//	"done"        the model gave a final answer (Outcome.Answer)
//	"step_limit"  the model had Config.MaxSteps turns and wanted another
//	"deadline"    the run's wall-clock budget (Config.Deadline) or the
//	              caller's context deadline passed
//	"repetition"  the model asked for the same tool with the same canonical
//	              arguments Config.RepeatLimit times (3 by default)
//	"error"       anything else that ends a run early (Outcome.Err says what:
//	              a model error, panic or timeout, a ledger stop signal, a
//	              failed checkpoint, a canceled context, a bad Input)
//
// # Guards
//
//   - Step cap: the number of model turns of the run. Before each step, when
//     the transcript already holds MaxSteps model turns (assistant
//     messages), the run ends with "step_limit". Turns of a resumed
//     transcript count, so a run that keeps crashing cannot escape the cap.
//   - Wall-clock deadline: checked at the start of every step and before
//     every tool call (the calls of the turn not started stay pending, and a
//     resumed run sends them under the same call ids); a model call
//     is also cut off when the deadline passes, and the run ends with
//     "deadline". The deadline also bounds the waits of a mutating call
//     inside client.Client.Do (it is passed with client.WithWaitDeadline):
//     on another holder's claim (IN_PROGRESS), in the backoff between
//     attempts, for a reconciler's answer. When it ends such a wait, the
//     run ends with "deadline", Outcome.Err is the *client.WaitDeadlineError
//     (client.ErrWaitDeadline), and the call stays pending: its operation
//     is left as the ledger has it (another holder's claim stays theirs),
//     so a run resumed from the transcript sends it again under the same
//     call id. A tool call in flight is not interrupted by the deadline
//     (cancelling a side effect half way is what makes outcomes ambiguous):
//     each tool is bounded by its own timeout (Tool.Policy.Timeout); its
//     outcome is recorded, and the check before the next call or step ends
//     the run.
//   - Model timeout: each model call gets Config.ModelTimeout. The model runs
//     on its own goroutine, so the timeout holds even for a model that
//     ignores its context (that goroutine is then abandoned; its answer is
//     discarded). A model call that times out ends the run with "error"
//     (Err matches ErrModelTimeout), unless the run's deadline passed
//     ("deadline").
//   - Repetition: every call's arguments are canonicalized with RFC 8785
//     (fingerprint.Compute: SHA-256 over JCS). Before a call runs, the
//     Runner counts the completed calls of the run (in the transcript) with
//     the same tool and the same canonical arguments; when this call would be
//     the RepeatLimit-th, it is not run (its result says so, so that a
//     resumed run goes on to the model) and the run ends with "repetition".
//     Map key order, and 1 versus 1.0, do not make arguments different;
//     nor do []string{"a"} and []any{"a"}: arguments with Go types of their
//     own ([]string, map[string]string, []int, structs...) are taken as
//     their JSON encoding, here and for the ledger, as result data is.
//     The guard bounds a looping model's cost; it does not deduplicate
//     effects: two calls with different call ids are two intents for the
//     ledger (at most RepeatLimit-1 of them run), while a call id sent again
//     is replayed by the ledger and never applies its effect twice.
//
// # Mutating tools and the ledger
//
// A Tool is mutating when it changes the world. Every call of a mutating
// tool goes through client.Client.Do with
//
//	Op.ID       = run_id + ":" + call_id
//	Op.Tool     = the tool's name
//	Op.Params   = the call's arguments (fingerprinted by the ledger, never stored)
//	Op.PermitID = Input.PermitID
//	Op.RunID    = run_id
//	Op.Step     = the step (model turn) that asked for the call
//
// so the tool's function runs only on an EXECUTE decision, a retryable
// failure is retried under the same operation id (Tool.Policy.MaxRetries), an
// ambiguous one is reconciled (Tool.Reconciler), and a call id sent again
// (after a crash, by a second worker, by a looping model) replays the
// recorded result instead of executing again. New passes each mutating
// tool's Policy and Reconciler to the client (client.Client.SetToolPolicy and
// RegisterReconciler; a zero Policy or nil Reconciler leaves the client's
// own setting). Run ids must be unique per run and should not contain ':'.
// Non-mutating tools run directly, bounded by Tool.Policy.Timeout: each runs
// on its own goroutine, so the timeout holds even for a tool that ignores
// its context (that goroutine is then abandoned, its answer discarded, and
// the model gets a timeout error for the call).
//
// The error of a mutating call is handed to the model as data only when it
// is a settled failure that leaves no unsettled effect behind: a final
// failure the ledger recorded or replayed (client.ErrOperationFailed),
// retryable failures that used up the retries (nothing was applied: every
// attempt of the operation ran in this call and failed retryably), a
// request refused as invalid before the tool ran, and a call the ledger
// refused (client.ErrKeyReused) because the model sent it under a call id
// that a completed call of the run used for another tool or other arguments
// (a model or adapter that numbers call ids per turn): nothing ran, the
// other call's operation is untouched, and the error asks the model for a
// new call id. Any other error ends the run with status "error" (deny by
// default): the ledger's stop signals (contract.md §5: client.ErrKeyReused
// otherwise, ErrKeyExpired, ErrNeedsReconciliation, where the
// effect may exist and a new call id must not be minted for it,
// ErrUnavailable, also when the ledger did not answer while Do recorded an
// outcome, ErrRateLimited, ErrQuotaExceeded, ErrUnauthenticated,
// ErrPermissionDenied, ...), any other refusal by the ledger, a message over
// gRPC's size limit (client.ErrMessageTooLarge), used-up retries after an attempt that was
// ambiguous or ran elsewhere (the ledger claims an UNKNOWN idempotent
// operation again without reconciling it, so the effect may exist under the
// operation's idempotency key, which a new call id would not share), an
// error the runner does not know, or the context ended. Such a call gets no result in the transcript: it stays
// pending, and a run resumed from that transcript sends it again under the
// same call id. The same holds for a call whose wait in Do the run's
// deadline ended (client.ErrWaitDeadline), except that the run ends with
// status "deadline".
// A result that the ledger failed to record (client.ErrCompletionNotRecorded)
// is handed to the model as a success: the effect happened. One the ledger
// refused because it records another outcome (client.ErrConflictingOutcome,
// which also matches client.ErrNeedsReconciliation) ends the run like the
// ledger's other stop signals: a human sorts it out. Result data that
// google.protobuf.Struct cannot carry as it is ([]string, map[string]string,
// structs...) is converted to JSON values before Do records it.
//
// # Resuming a run
//
// Config.Checkpoint is called with the transcript after every message the
// Runner adds (the model's turn before its calls run, then each tool
// result), on a context that the caller's end does not cancel (for at most
// 10s): an effect the ledger recorded after the caller gave up is saved
// too. To resume after a crash, call Run with the same RunID and the
// last saved transcript: calls of the last model turn that have no result
// are sent again first (same call ids, so mutating ones replay or reconcile),
// then the loop goes on. The caller may append messages to the saved
// transcript before resuming (a new user message, say): the results of the
// pending calls then go, in call order, right after the results that turn
// already has (right after the turn when it has none), before the appended
// messages, because model APIs refuse a transcript in which another message
// comes between a turn and its results. This holds for every result of a
// pending call, the repetition guard's "not run" result included; a call not
// started (the run stopped before it) still has no result and stays pending.
// The checkpoints see that order, and the next model turn comes after the
// whole transcript, as usual. The Input's transcript itself is not modified
// (the Runner works on a copy). A transcript that ends with a final answer
// returns "done" at once without calling the model. Runs with the same RunID
// may even run concurrently: the ledger lets one of them execute each call.
//
// # Panics
//
// A panic in the model ends the run with status "error" (Err is a
// *PanicError). A panic in a non-mutating tool becomes a tool error handed to
// the model ("tool panicked: ..."), and the run goes on. A panic in a
// mutating tool ends the run with status "error": its effect is unknown (the
// SDK marks the operation UNKNOWN), so like every outcome that needs
// reconciliation it must not be retried under a new call id; the call stays
// pending. A panic in a Checkpoint function or in the Runner itself also
// ends the run with "error".
//
// # Logging contract
//
// The Runner writes, to Config.Logger (slog.Default when nil), at level
// INFO, exactly one "tool_start" record when a tool attempt starts and
// exactly one "tool_end" record when it ends:
//
//   - a non-mutating call is one attempt (attempt=1);
//   - a mutating call has one attempt per run of its function inside Do
//     (attempt = the ledger's attempt number, so a retry after a refusal is
//     attempt 2);
//   - a mutating call that runs its function zero times (a replay of the
//     recorded result, a reconciliation that found the effect, a refusal by
//     the ledger) gets exactly one start/end pair, written when the ledger's
//     answer arrives, with replayed=true when the outcome came from the
//     ledger's record (attempt = the attempt that produced it, 0 when
//     unknown), replayed=false otherwise;
//   - a call that is not attempted at all (unknown tool, missing call id,
//     arguments with no canonical form, stopped by a guard) gets no record.
//
// Both records carry exactly these attributes, in this order:
//
//	run_id       string  Input.RunID
//	step         int     the model turn that asked for the call (1-based)
//	tool         string  the tool's name
//	call_id      string  the model's call id
//	attempt      int     see above
//	replayed     bool    see above
//	args_sha256  string  lowercase hex SHA-256 of the RFC 8785 canonical
//	                     arguments (fingerprint.Compute(args, nil)); it equals
//	                     the ledger's params_sha256 unless the ledger's policy
//	                     names consequential fields
//
// and "tool_end" adds
//
//	duration_ms  int64   wall-clock time of the attempt in milliseconds
//	ok           bool    the attempt succeeded (for a replay: the replayed
//	                     outcome is a success)
//
// At the end of every run one "run_end" record carries run_id, status and
// steps. No record ever carries argument values, results, errors, model
// text, user messages or secrets: ids and digests only.
package agent
