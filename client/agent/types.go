package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/opledger/ledger/client"
)

// Status is how a run ended. Its values are the strings of contract.md S14.
type Status string

// The terminal statuses of a run (see the package doc).
const (
	// StatusDone: the model gave a final answer.
	StatusDone Status = "done"
	// StatusStepLimit: the model used up Config.MaxSteps turns, or the
	// ledger's run guard refused a call past the run's max_steps or
	// max_irreversible (Config.RunLimits, or the tenant's policy).
	StatusStepLimit Status = "step_limit"
	// StatusDeadline: the run's wall-clock deadline (or the caller's context
	// deadline) passed: at the start of a step, before a tool call (the
	// calls not started stay pending), during a model call, or while a
	// mutating call waited on the ledger (Outcome.Err is then the
	// client's *client.WaitDeadlineError, and the call stays pending).
	StatusDeadline Status = "deadline"
	// StatusRepetition: the model asked for the same tool with the same
	// canonical arguments Config.RepeatLimit times, or the ledger's run
	// guard refused a call past the run's max_repeats.
	StatusRepetition Status = "repetition"
	// StatusError: the run ended early for another reason; Outcome.Err says
	// why.
	StatusError Status = "error"
)

// Role says who wrote a Message.
type Role string

// The roles of transcript messages.
const (
	// RoleUser is a message from the user (or the system that started the
	// run): Message.Text.
	RoleUser Role = "user"
	// RoleAssistant is a model turn: Message.Text and Message.Calls.
	RoleAssistant Role = "assistant"
	// RoleTool is the result of one tool call: Message.Result.
	RoleTool Role = "tool"
)

// Message is one entry of a run's transcript. The Runner appends messages,
// except the results of a resumed run's pending calls, which it inserts
// after their turn's results, before messages the caller appended (see
// "Resuming a run" in the package doc). It never changes a message or a
// transcript it has handed out (an insertion makes a new transcript), and
// callers must not change them either (they may be shared with the model and
// the checkpoint).
type Message struct {
	// Role says who wrote the message.
	Role Role
	// Text is the user's message, or the model's text (its final answer
	// when Calls is empty).
	Text string
	// Calls are the tool calls of an assistant message.
	Calls []ToolCall
	// Result is the outcome of one call, in a tool message.
	Result *ToolResult
}

// ToolCall is one tool call the model asked for.
type ToolCall struct {
	// ID is the model's call id. It must be unique within the run and stable
	// across resumptions: a mutating call's operation id is
	// run_id + ":" + ID. A mutating call under an id that a completed call
	// of the run used for another tool or other arguments is refused by the
	// ledger and not run; the model gets an error result asking for a new
	// call id. The same id with the same tool and arguments replays.
	ID string
	// Name is the tool's name.
	Name string
	// Args are the arguments: JSON-like values (map[string]any, []any,
	// string, float64, int, bool, nil). nil is the empty object. Other Go
	// values ([]string, map[string]string, []int, structs...) are
	// fingerprinted and sent to the ledger as their JSON encoding, as
	// result data is, so they are the same request as the JSON values
	// they encode to; the tool gets Args as they are.
	Args map[string]any
}

// ToolResult is what the model learns about one tool call.
type ToolResult struct {
	// CallID and Tool identify the call.
	CallID string
	Tool   string
	// Data and ResourceID are the tool's result when it succeeded.
	Data       map[string]any
	ResourceID string
	// Error is set when the call failed: the tool's error, a final failure
	// recorded by the ledger, an unknown tool... It is data for the model.
	Error string
	// Replayed is true when the result came from the ledger's record (an
	// earlier run of the same call) rather than from running the tool now.
	Replayed bool
}

// Turn is the model's answer for one step.
type Turn struct {
	// Text is the model's text; with no Calls it is the final answer.
	Text string
	// Calls are the tools the model wants run, in order. None means the run
	// is done.
	Calls []ToolCall
}

// Model is the agent's model: the Runner calls Next once per step with the
// transcript so far. Next should honour ctx (it carries the model timeout and
// the run's deadline); it must not modify the transcript.
type Model interface {
	// Next returns the model's turn for the transcript so far: tool calls,
	// or the final answer. An error ends the run with status "error"
	// (retry transient API errors inside Next).
	Next(ctx context.Context, transcript []Message) (Turn, error)
}

// ModelFunc adapts a function to Model.
type ModelFunc func(ctx context.Context, transcript []Message) (Turn, error)

// Next calls f.
func (f ModelFunc) Next(ctx context.Context, transcript []Message) (Turn, error) {
	return f(ctx, transcript)
}

// Call is what a tool's function gets for one attempt.
type Call struct {
	// RunID, Step and ID identify the call: the run, the model turn that
	// asked for it (1-based) and the model's call id.
	RunID string
	Step  int
	ID    string
	// Tool is the tool's name.
	Tool string
	// Args are the call's arguments. Do not modify them.
	Args map[string]any
	// Attempt is the ledger's attempt, for a mutating tool (zero otherwise):
	// Attempt.OperationID (run_id:call_id) identifies the operation at the
	// destination, Attempt.IdempotencyKey goes to destinations that honour
	// one, Attempt.Number counts the claims.
	Attempt client.Attempt
}

// ToolFunc runs one attempt of a tool. For a mutating tool its error is
// classified by client.ClassOf: wrap it with client.MarkRetryable (proven
// not applied), client.MarkFinal (refused for good) or leave it ambiguous.
// Result.Replayed and Result.Attempt are ignored.
type ToolFunc func(ctx context.Context, call Call) (client.Result, error)

// Tool is a tool the model may call.
type Tool struct {
	// Name is what the model calls it; for a mutating tool it is also the
	// ledger's tool name (ASCII letters, digits and . _ - : /).
	Name string
	// Mutating is true for tools with side effects: their calls go through
	// the ledger (client.Client.Do).
	Mutating bool
	// Policy is how the client treats a mutating tool: a fresh Timeout per
	// attempt, MaxRetries after a retryable or ambiguous outcome, and the
	// Effect sent with Reserve. New passes it to [client.Client.SetToolPolicy] unless
	// it is the zero value. Policy.Timeout also bounds each run of a
	// non-mutating tool (client.DefaultToolPolicy.Timeout when zero), even
	// one that ignores its context.
	Policy client.ToolPolicy
	// Reconciler asks the destination whether a mutating call's effect
	// exists when its outcome is unknown; New registers it with the client
	// ([client.Client.RegisterReconciler]) unless it is nil.
	Reconciler client.Reconciler
	// Func runs the tool. Required.
	Func ToolFunc
}

// Defaults of Config.
const (
	// DefaultMaxSteps is Config.MaxSteps when zero.
	DefaultMaxSteps = 20
	// DefaultDeadline is Config.Deadline when zero.
	DefaultDeadline = 5 * time.Minute
	// DefaultModelTimeout is Config.ModelTimeout when zero.
	DefaultModelTimeout = 2 * time.Minute
	// DefaultRepeatLimit is Config.RepeatLimit when zero.
	DefaultRepeatLimit = 3
)

// Config configures a Runner.
type Config struct {
	// Client is the ledger client mutating tools go through. Required when a
	// tool is mutating. New sets each mutating tool's Policy and Reconciler
	// on it by the tool's name, so Runners that share a Client share them:
	// give tools of the same name the same policy, or give each Runner a
	// Client of its own.
	Client *client.Client
	// Model is the agent's model. Required.
	Model Model
	// Tools are the tools the model may call; names must be unique.
	Tools []Tool
	// MaxSteps caps the model turns of a run (DefaultMaxSteps when zero).
	MaxSteps int
	// Deadline is the wall-clock budget of one Run call, checked at the
	// start of every step and before every tool call, bounding every model call and every wait of a
	// mutating call inside client.Client.Do (another holder's claim,
	// backoff, reconciliation: see client.WithWaitDeadline), but never a
	// tool that is running (DefaultDeadline when zero).
	Deadline time.Duration
	// ModelTimeout bounds each model call (DefaultModelTimeout when zero).
	ModelTimeout time.Duration
	// RepeatLimit is how many times the same tool with the same canonical
	// arguments ends the run (DefaultRepeatLimit when zero; at least 2).
	RepeatLimit int
	// RunLimits, when set, start the run in the ledger (StartRun, with
	// Input.RunID) before its first step, so the ledger counts its mutating
	// calls for every worker of the run: a call it refuses ends the run
	// with StatusStepLimit, StatusDeadline or StatusRepetition (the call
	// stays pending). The ledger counts tool calls (new operations); the
	// Runner's MaxSteps counts model turns. Without it the tenant's policy
	// may still govern the run.
	RunLimits *client.RunLimits
	// Logger receives the records of the logging contract (slog.Default
	// when nil).
	Logger *slog.Logger
	// Checkpoint, when set, is called after every message the Runner
	// adds, with the whole transcript (do not modify it). An error ends
	// the run with status "error": a runtime that cannot save its state must
	// not go on. Resume by calling Run with the last saved transcript.
	// Its context carries Run's values but not its cancellation: it ends
	// 10s after the call starts, so that a message recording an effect
	// (which the ledger records past the caller's end) is saved even when
	// the caller's context has ended meanwhile.
	Checkpoint func(ctx context.Context, runID string, transcript []Message) error
}

// Input is what one Run call works on.
type Input struct {
	// RunID identifies the run; required, unique per run, stable across
	// resumptions, without ':' (operation ids are run_id:call_id; Run ends
	// with StatusError on a run id with ':').
	RunID string
	// PermitID is the authorization grant the run acts under (the user's
	// approval); it is bound to every mutating operation.
	PermitID string
	// Transcript is the run so far: the user's request, or the last saved
	// transcript of a run being resumed. It is copied, never modified.
	Transcript []Message
}

// Outcome is how a run ended.
type Outcome struct {
	// Status is the terminal status.
	Status Status
	// Answer is the model's final answer, with StatusDone.
	Answer string
	// Steps is the number of model turns in the transcript.
	Steps int
	// Transcript is the whole transcript at the end of the run, including
	// the input.
	Transcript []Message
	// Reason says in plain words why the run ended (ids, tool names and
	// counts only, never argument values).
	Reason string
	// Err is the cause, with StatusError; it matches the client's sentinels
	// (client.ErrKeyReused, ...), ErrModelTimeout, or is a *PanicError. With
	// StatusDeadline it is the *client.WaitDeadlineError of a mutating call
	// whose wait the deadline ended (client.ErrWaitDeadline), nil when the
	// deadline came elsewhere. Nil otherwise.
	Err error
}

// ErrModelTimeout is the cause of a run that ended because one model call
// took longer than Config.ModelTimeout.
var ErrModelTimeout = errors.New("agent: the model call timed out")

// errRunDeadline is the cause of a model call cut off by the run's deadline.
var errRunDeadline = errors.New("agent: the run's deadline passed")

// PanicError is a recovered panic.
type PanicError struct {
	// Where is "model", "tool <name>", "checkpoint" or "runner".
	Where string
	// Value is what was passed to panic.
	Value any
	// Stack is the panicking goroutine's stack.
	Stack []byte
}

// Error describes the panic.
func (e *PanicError) Error() string { return fmt.Sprintf("agent: %s panicked: %v", e.Where, e.Value) }
