package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/internal/jsonvalue"
)

// Runner runs agent loops (see the package doc). It is safe for concurrent
// use: each Run has its own state.
type Runner struct {
	client       *client.Client
	model        Model
	tools        map[string]Tool
	maxSteps     int
	deadline     time.Duration
	modelTimeout time.Duration
	repeatLimit  int
	runLimits    *client.RunLimits
	log          *slog.Logger
	checkpoint   func(context.Context, string, []Message) error
}

// New checks cfg, fills in its defaults, and passes the policies and
// reconcilers of mutating tools to cfg.Client.
func New(cfg Config) (*Runner, error) {
	if cfg.Model == nil {
		return nil, errors.New("agent: Config.Model is required")
	}
	if cfg.MaxSteps < 0 || cfg.Deadline < 0 || cfg.ModelTimeout < 0 || cfg.RepeatLimit < 0 {
		return nil, errors.New("agent: MaxSteps, Deadline, ModelTimeout and RepeatLimit must not be negative")
	}
	if cfg.RepeatLimit == 1 {
		return nil, errors.New("agent: RepeatLimit 1 would refuse every call; use 2 or more")
	}
	if cfg.RunLimits != nil && cfg.Client == nil {
		return nil, errors.New("agent: Config.RunLimits needs Config.Client")
	}
	r := &Runner{
		client:       cfg.Client,
		model:        cfg.Model,
		tools:        make(map[string]Tool, len(cfg.Tools)),
		maxSteps:     orDefault(cfg.MaxSteps, DefaultMaxSteps),
		deadline:     orDefault(cfg.Deadline, DefaultDeadline),
		modelTimeout: orDefault(cfg.ModelTimeout, DefaultModelTimeout),
		repeatLimit:  orDefault(cfg.RepeatLimit, DefaultRepeatLimit),
		runLimits:    cfg.RunLimits,
		log:          cfg.Logger,
		checkpoint:   cfg.Checkpoint,
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	for _, t := range cfg.Tools {
		switch {
		case t.Name == "":
			return nil, errors.New("agent: a tool has no name")
		case t.Func == nil:
			return nil, fmt.Errorf("agent: tool %q has no Func", t.Name)
		case t.Mutating && cfg.Client == nil:
			return nil, fmt.Errorf("agent: tool %q is mutating: Config.Client is required", t.Name)
		}
		if _, dup := r.tools[t.Name]; dup {
			return nil, fmt.Errorf("agent: tool %q is registered twice", t.Name)
		}
		r.tools[t.Name] = t
	}
	for _, t := range cfg.Tools {
		if !t.Mutating {
			continue
		}
		if t.Policy != (client.ToolPolicy{}) {
			cfg.Client.SetToolPolicy(t.Name, t.Policy)
		}
		if t.Reconciler != nil {
			cfg.Client.RegisterReconciler(t.Name, t.Reconciler)
		}
	}
	return r, nil
}

// orDefault returns v, or def when v is zero.
func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// run is the state of one Run call.
type run struct {
	*Runner
	in         Input
	transcript []Message
	until      time.Time // the run's deadline
	steps      int
	counts     map[string]int      // completed calls per tool + canonical arguments
	byID       map[string][]string // tool + canonical arguments of the completed calls per call id
}

// Run runs the agent loop on in until it ends, and returns how it ended. It
// never panics; see the package doc for the statuses, guards and resumption.
func (r *Runner) Run(ctx context.Context, in Input) (out Outcome) {
	s := &run{
		Runner:     r,
		in:         in,
		transcript: slices.Clone(in.Transcript),
		until:      time.Now().Add(r.deadline),
		counts:     map[string]int{},
		byID:       map[string][]string{},
	}
	defer func() {
		if p := recover(); p != nil {
			out = s.end(StatusError, "the runner panicked", &PanicError{Where: "runner", Value: p, Stack: debug.Stack()})
		}
		r.log.LogAttrs(ctx, slog.LevelInfo, "run_end",
			slog.String("run_id", in.RunID), slog.String("status", string(out.Status)), slog.Int("steps", out.Steps))
	}()
	if in.RunID == "" {
		return s.end(StatusError, "no run id", errors.New("agent: Input.RunID is required"))
	}
	if strings.Contains(in.RunID, ":") {
		// Operation ids are run_id:call_id: run "a:b" with call "c" and run
		// "a" with call "b:c" would share one, and the second would replay
		// the first's result instead of running.
		return s.end(StatusError, "a run id with ':'", errors.New("agent: Input.RunID must not contain ':'"))
	}
	if r.runLimits != nil && r.client != nil {
		if _, err := r.client.StartRun(ctx, in.RunID, *r.runLimits); err != nil {
			return s.end(StatusError, "the ledger did not start the run", fmt.Errorf("agent: StartRun: %w", err))
		}
	}
	pending, at := s.replayTranscript()
	if n := len(s.transcript); n > 0 && s.transcript[n-1].Role == RoleAssistant && len(s.transcript[n-1].Calls) == 0 {
		o := s.end(StatusDone, "the transcript already ends with a final answer", nil)
		o.Answer = s.transcript[n-1].Text
		return o
	}
	if len(pending) > 0 {
		if o, stop := s.runCalls(ctx, pending, at); stop {
			return o
		}
	}
	for {
		if o, stop := s.guards(ctx); stop {
			return o
		}
		s.steps++
		turn, err := s.callModel(ctx)
		if err != nil {
			return s.modelFailed(ctx, err)
		}
		if o, stop := s.addMessage(ctx, len(s.transcript), Message{Role: RoleAssistant, Text: turn.Text, Calls: slices.Clone(turn.Calls)}); stop {
			return o
		}
		if len(turn.Calls) == 0 {
			o := s.end(StatusDone, "the model gave its final answer", nil)
			o.Answer = turn.Text
			return o
		}
		if o, stop := s.runCalls(ctx, turn.Calls, len(s.transcript)); stop {
			return o
		}
	}
}

// replayTranscript counts the input's model turns and completed calls, and
// returns the calls of the last model turn that have no result yet, with
// the index where their results go: right after that turn's last result (or
// after the turn when it has none), before any message the caller appended
// after it, since model APIs want a turn's results directly after it.
// Results follow their turn's calls in order, so a result answers the first
// call of the turn with its call id that has none yet: a model may send one
// id twice.
func (s *run) replayTranscript() (pending []ToolCall, at int) {
	var (
		last []ToolCall // calls of the latest assistant message
		done []bool     // which of them have a result
	)
	for i, m := range s.transcript {
		switch m.Role {
		case RoleAssistant:
			s.steps++
			last, done, at = m.Calls, make([]bool, len(m.Calls)), i+1
		case RoleTool:
			if m.Result == nil {
				continue
			}
			for j, c := range last {
				if !done[j] && c.ID == m.Result.CallID {
					done[j], at = true, i+1
					s.completed(c)
					break
				}
			}
		}
	}
	for i, c := range last {
		if !done[i] {
			pending = append(pending, c)
		}
	}
	return pending, at
}

// guards checks, before a model turn, the caller's context, the deadline and
// the step cap.
func (s *run) guards(ctx context.Context) (Outcome, bool) {
	if err := ctx.Err(); err != nil {
		return s.ctxEnded(ctx), true
	}
	if !time.Now().Before(s.until) {
		return s.end(StatusDeadline, fmt.Sprintf("the run's deadline (%s) passed before step %d", s.deadline, s.steps+1), nil), true
	}
	if s.steps >= s.maxSteps {
		return s.end(StatusStepLimit, fmt.Sprintf("the model had %d turns, the step cap", s.steps), nil), true
	}
	return Outcome{}, false
}

// ctxEnded is the outcome of a run whose caller's context ended.
func (s *run) ctxEnded(ctx context.Context) Outcome {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return s.end(StatusDeadline, "the caller's context deadline passed", nil)
	}
	return s.end(StatusError, "the caller's context ended", context.Cause(ctx))
}

// callModel asks the model for the next turn, on its own goroutine, so the
// model timeout and the deadline hold even if the model ignores ctx.
func (s *run) callModel(ctx context.Context) (Turn, error) {
	mctx, cancel := context.WithTimeoutCause(ctx, s.modelTimeout, ErrModelTimeout)
	defer cancel()
	mctx, cancelRun := context.WithDeadlineCause(mctx, s.until, errRunDeadline)
	defer cancelRun()
	type answer struct {
		turn Turn
		err  error
	}
	ch := make(chan answer, 1) // buffered: an abandoned model does not block
	transcript := slices.Clip(s.transcript)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				ch <- answer{err: &PanicError{Where: "model", Value: p, Stack: debug.Stack()}}
			}
		}()
		t, err := s.model.Next(mctx, transcript)
		ch <- answer{t, err}
	}()
	select {
	case a := <-ch:
		if a.err != nil && mctx.Err() != nil {
			return Turn{}, fmt.Errorf("%w (%w)", context.Cause(mctx), a.err)
		}
		return a.turn, a.err
	case <-mctx.Done():
		return Turn{}, context.Cause(mctx)
	}
}

// modelFailed is the outcome of a model call that failed.
func (s *run) modelFailed(ctx context.Context, err error) Outcome {
	switch {
	case ctx.Err() != nil:
		return s.ctxEnded(ctx)
	case errors.Is(err, errRunDeadline) || !time.Now().Before(s.until):
		return s.end(StatusDeadline, fmt.Sprintf("the run's deadline (%s) passed during step %d", s.deadline, s.steps), nil)
	case errors.Is(err, ErrModelTimeout):
		return s.end(StatusError, fmt.Sprintf("the model call of step %d took longer than %s", s.steps, s.modelTimeout), err)
	}
	var p *PanicError
	if errors.As(err, &p) {
		return s.end(StatusError, fmt.Sprintf("the model panicked in step %d", s.steps), err)
	}
	return s.end(StatusError, fmt.Sprintf("the model failed in step %d", s.steps), fmt.Errorf("agent: model: %w", err))
}

// runCalls runs a turn's calls in order and puts their results, in the same
// order, into the transcript from index at on: at the end for a new turn,
// after the results a resumed turn already has for its pending calls. No
// call starts once the caller's context has ended or the run's deadline has
// passed: the calls left stay pending.
func (s *run) runCalls(ctx context.Context, calls []ToolCall, at int) (Outcome, bool) {
	for _, c := range calls {
		if ctx.Err() != nil {
			return s.ctxEnded(ctx), true
		}
		if !time.Now().Before(s.until) {
			return s.end(StatusDeadline, fmt.Sprintf("the run's deadline (%s) passed before call %s of step %d (it stays pending)", s.deadline, c.ID, s.steps), nil), true
		}
		key, keyErr := repeatKey(c)
		if keyErr == nil && s.counts[key]+1 >= s.repeatLimit {
			// The call gets a result saying it was not run, so that a run
			// resumed (with a user's new message, say) goes on to the model
			// instead of meeting the same call first and stopping again.
			n := s.counts[key] + 1
			refused := ToolResult{CallID: c.ID, Tool: c.Name,
				Error: fmt.Sprintf("not run: tool %q was asked for with the same arguments %d times; the run stopped (repetition)", c.Name, n)}
			if o, stop := s.addMessage(ctx, at, Message{Role: RoleTool, Result: &refused}); stop {
				return o, true
			}
			return s.end(StatusRepetition, fmt.Sprintf("the model asked for tool %q with the same arguments %d times (call %s of step %d not run)",
				c.Name, n, c.ID, s.steps), nil), true
		}
		res, stop := s.runCall(ctx, c, keyErr)
		if stop != nil {
			if ctx.Err() != nil {
				return s.ctxEnded(ctx), true
			}
			if rr, ok := client.RunOf(stop); ok {
				return s.end(runStatus(rr.State), fmt.Sprintf("the ledger's run guard refused call %s of tool %q: the run ended (%s)",
					c.ID, c.Name, rr.State), stop), true
			}
			if errors.Is(stop, client.ErrWaitDeadline) {
				return s.end(StatusDeadline, fmt.Sprintf("the run's deadline (%s) passed while call %s of tool %q waited on the ledger (it stays pending)",
					s.deadline, c.ID, c.Name), stop), true
			}
			return s.end(StatusError, fmt.Sprintf("the ledger stopped call %s of tool %q (it stays pending)", c.ID, c.Name), stop), true
		}
		s.completed(c)
		if o, stop := s.addMessage(ctx, at, Message{Role: RoleTool, Result: &res}); stop {
			return o, true
		}
		at++
	}
	return Outcome{}, false
}

// runStatus is the Runner's status for a run the ledger ended in state.
func runStatus(state client.RunState) Status {
	switch state {
	case client.RunStepLimit:
		return StatusStepLimit
	case client.RunDeadline:
		return StatusDeadline
	case client.RunRepetition:
		return StatusRepetition
	}
	return StatusError
}

// completed counts a call that has its result.
func (s *run) completed(c ToolCall) {
	if key, err := repeatKey(c); err == nil {
		s.counts[key]++
		s.byID[c.ID] = append(s.byID[c.ID], key)
	}
}

// idTaken says whether a completed call of the run has c's call id but
// another tool or other canonical arguments: the operation run_id:call_id is
// that call's, and c is another intent the model sent under the same id.
func (s *run) idTaken(c ToolCall) bool {
	key, err := repeatKey(c)
	return err == nil && slices.ContainsFunc(s.byID[c.ID], func(k string) bool { return k != key })
}

// repeatKey identifies a call's tool and canonical arguments.
func repeatKey(c ToolCall) (string, error) {
	args, err := callArgs(c)
	if err != nil {
		return "", err
	}
	fp, err := fingerprint.Compute(args, nil)
	if err != nil {
		return "", err
	}
	return c.Name + "\x00" + fp.String(), nil
}

// callArgs returns a call's arguments as the ledger fingerprints them
// (jsonvalue.Params): as they are when they have a canonical form,
// otherwise as the JSON values they encode to, as Op.Params is converted,
// so that the same arguments built in Go or decoded from JSON are the same
// request.
func callArgs(c ToolCall) (map[string]any, error) {
	return jsonvalue.Params(c.Args)
}

// runCall runs one call. A non-nil stop error ends the run (the call stays
// pending); otherwise the result, failed or not, goes to the model.
func (s *run) runCall(ctx context.Context, c ToolCall, argsErr error) (res ToolResult, stop error) {
	res = ToolResult{CallID: c.ID, Tool: c.Name}
	t, ok := s.tools[c.Name]
	switch {
	case !ok:
		res.Error = fmt.Sprintf("unknown tool %q", c.Name)
		return res, nil
	case c.ID == "":
		res.Error = "the call has no call id"
		return res, nil
	case argsErr != nil:
		res.Error = "invalid arguments: " + argsErr.Error()
		return res, nil
	}
	args, _ := callArgs(c)                  // argsErr is nil
	fp, _ := fingerprint.Compute(args, nil) // likewise
	lc := logCall{run: s, call: c, sha: fp.String()}
	if !t.Mutating {
		return s.runDirect(ctx, t, c, lc), nil
	}
	return s.runMutating(ctx, t, c, args, lc)
}

// runDirect runs a non-mutating tool: one attempt, bounded by its timeout.
// The tool runs on its own goroutine, so the timeout holds even for a tool
// that ignores its context (like the model's; a read has no effect to lose):
// that goroutine is then abandoned and its answer discarded.
func (s *run) runDirect(ctx context.Context, t Tool, c ToolCall, lc logCall) (res ToolResult) {
	res = ToolResult{CallID: c.ID, Tool: c.Name}
	timeout := t.Policy.Timeout
	if timeout <= 0 {
		timeout = client.DefaultToolPolicy.Timeout
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	started := lc.start(ctx, 1, false)
	type answer struct {
		out      client.Result
		err      error
		panicked string // "tool panicked: ..." when it did
	}
	ch := make(chan answer, 1) // buffered: an abandoned tool does not block
	call := s.toolCall(c, client.Attempt{})
	go func() {
		defer func() {
			if p := recover(); p != nil {
				ch <- answer{panicked: fmt.Sprintf("tool panicked: %v", p)}
			}
		}()
		out, err := t.Func(tctx, call)
		ch <- answer{out: out, err: err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-tctx.Done():
		select {
		case a = <-ch: // it answered as its context ended
		default:
			if ctx.Err() != nil {
				a.err = ctx.Err()
			} else {
				a.err = fmt.Errorf("the tool timed out after %s", timeout)
			}
		}
	}
	switch {
	case a.panicked != "":
		res.Error = a.panicked
	case a.err != nil:
		res.Error = a.err.Error()
	default:
		res.Data, res.ResourceID = a.out.Data, a.out.ResourceID
	}
	lc.end(ctx, 1, false, started, a.panicked == "" && a.err == nil)
	return res
}

// runMutating runs a mutating tool through the ledger; args are the call's
// arguments as callArgs returns them.
func (s *run) runMutating(ctx context.Context, t Tool, c ToolCall, args map[string]any, lc logCall) (ToolResult, error) {
	res := ToolResult{CallID: c.ID, Tool: c.Name}
	op := client.Op{
		ID: s.in.RunID + ":" + c.ID, Tool: c.Name, Params: args,
		PermitID: s.in.PermitID, RunID: s.in.RunID, Step: uint32(s.steps),
	}
	// fn runs on Do's goroutine, synchronously. proven stays true while
	// every attempt of the operation so far ran here (attempts 1, 2, ...)
	// and failed retryably, that is proven not applied.
	attempts, proven := 0, true
	fn := func(actx context.Context, a client.Attempt) (out client.Result, err error) {
		attempts++
		if a.Number != uint32(attempts) {
			proven = false // an attempt ran elsewhere, its outcome unknown here
		}
		started := lc.start(ctx, a.Number, false)
		ok := false
		defer func() { lc.end(ctx, a.Number, false, started, ok) }() // also when fn panics
		out, err = t.Func(actx, s.toolCall(c, a))
		if err != nil && client.ClassOf(err) != client.Retryable {
			proven = false
		}
		ok = err == nil
		if ok {
			out.Data = jsonData(out.Data)
		}
		return out, err
	}
	began := time.Now()
	// The run's deadline bounds Do's waits (another holder's claim, backoff,
	// reconciliation), never fn: a tool under way finishes and is recorded.
	out, err, panicked := s.do(client.WithWaitDeadline(ctx, s.until), op, fn)
	if panicked != nil {
		// The SDK marked the operation UNKNOWN: reconcile, never re-mint.
		return res, panicked
	}
	if attempts == 0 {
		replayed, attempt := out.Replayed, out.Attempt
		var fe *client.FailedError
		if errors.As(err, &fe) {
			replayed = fe.Replayed
		}
		lc.start(ctx, attempt, replayed)
		lc.end(ctx, attempt, replayed, began, err == nil)
	}
	switch {
	case err == nil, errors.Is(err, client.ErrCompletionNotRecorded):
		// The effect happened (a result the ledger failed to record is
		// reconciled as applied later).
		res.Data, res.ResourceID, res.Replayed = out.Data, out.ResourceID, out.Replayed
		return res, nil
	case errors.Is(err, client.ErrKeyReused) && attempts == 0 && s.idTaken(c):
		// The model sent a new intent under a call id the run already used
		// for another call: the ledger refused it and ran nothing, and the
		// other call's operation is untouched. The model may ask again under
		// a new call id.
		res.Error = fmt.Sprintf("call id %q was already used in this run for another call; this call was not run (ask again under a new call id): %v", c.ID, err)
		return res, nil
	case !settled(ctx, err, attempts > 0, proven):
		return res, err
	}
	res.Error = err.Error()
	return res, nil
}

// jsonData returns data as the JSON values the ledger records
// (jsonvalue.Params: Go types of their own, []string, map[string]string,
// structs, through their JSON encoding), so the model gets what the ledger
// replays. Data without an exact JSON form (an integer the wire's doubles
// would round, a string that is not valid UTF-8) stays as it is: the SDK
// then refuses to record it changed and leaves the effect to
// reconciliation.
func jsonData(data map[string]any) map[string]any {
	if data == nil {
		return nil
	}
	out, err := jsonvalue.Params(data)
	if err != nil {
		return data
	}
	return out
}

// do calls client.Do and recovers a panic of the tool, which Do lets through
// after marking the operation UNKNOWN.
func (s *run) do(ctx context.Context, op client.Op, fn client.Func) (out client.Result, err error, panicked error) {
	defer func() {
		if p := recover(); p != nil {
			panicked = &PanicError{Where: "tool " + op.Tool, Value: p, Stack: debug.Stack()}
		}
	}()
	out, err = s.client.Do(ctx, op, fn)
	return out, err, nil
}

// settled says whether a mutating call's error is a settled failure to hand
// to the model, which may then ask again under a new call id: a final
// failure (recorded, or replayed), retries used up by failures proven not
// applied (proven: every attempt of the operation ran in this Do and failed
// retryably; an ambiguous attempt of an idempotent operation is claimed
// again without reconciliation, so its effect may exist under the
// operation's idempotency key, which a new call id would not share), or a
// request the ledger refused as malformed before fn ran.
// Anything else stops the run (deny by default): a ledger stop signal
// (contract.md §5), an effect that may exist, an outcome the ledger did not record or did
// not answer about, the run's context ended or its deadline passed while Do
// waited (client.ErrWaitDeadline), and errors not known here.
func settled(ctx context.Context, err error, ran, proven bool) bool {
	if ctx.Err() != nil || errors.Is(err, client.ErrNeedsReconciliation) || errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrWaitDeadline) {
		return false
	}
	var (
		le *client.Error
		fe *client.FailedError
		ee *client.ExhaustedError
	)
	if errors.As(err, &le) {
		// The ledger refused a call; only a Reserve of malformed input (fn
		// never ran) is the model's to fix. Any other refusal, also one of
		// recording an outcome, leaves the operation for the ledger to settle.
		return !ran && errors.Is(err, client.ErrInvalidArgument)
	}
	return errors.As(err, &fe) || errors.As(err, &ee) && !ee.Ambiguous && proven
}

func (s *run) toolCall(c ToolCall, a client.Attempt) Call {
	return Call{RunID: s.in.RunID, Step: s.steps, ID: c.ID, Tool: c.Name, Args: c.Args, Attempt: a}
}

// checkpointTimeout bounds each Config.Checkpoint call, which runs even
// when the caller's context has ended.
const checkpointTimeout = 10 * time.Second

// addMessage puts m at index i of the transcript (len(s.transcript) appends
// it) and saves the transcript. Inserting before the end makes a new slice:
// the model and the checkpoint may still hold the old one, which must not
// change under them.
func (s *run) addMessage(ctx context.Context, i int, m Message) (o Outcome, stop bool) {
	if i == len(s.transcript) {
		s.transcript = append(s.transcript, m)
	} else {
		s.transcript = slices.Concat(s.transcript[:i:i], []Message{m}, s.transcript[i:])
	}
	if s.checkpoint == nil {
		return Outcome{}, false
	}
	defer func() {
		if p := recover(); p != nil {
			o, stop = s.end(StatusError, "the checkpoint panicked", &PanicError{Where: "checkpoint", Value: p, Stack: debug.Stack()}), true
		}
	}()
	// The message may record an effect the ledger has recorded past the
	// caller's end (Do reports on its own): the checkpoint is saved on a
	// context that the caller's end does not cancel, for a bounded time.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkpointTimeout)
	defer cancel()
	if err := s.checkpoint(cctx, s.in.RunID, slices.Clip(s.transcript)); err != nil {
		return s.end(StatusError, "the transcript could not be saved", fmt.Errorf("agent: checkpoint: %w", err)), true
	}
	return Outcome{}, false
}

// end builds the outcome.
func (s *run) end(st Status, reason string, err error) Outcome {
	return Outcome{Status: st, Steps: s.steps, Transcript: slices.Clip(s.transcript), Reason: reason, Err: err}
}

// logCall writes the logging contract's records for one call.
type logCall struct {
	run  *run
	call ToolCall
	sha  string
}

func (l logCall) attrs(attempt uint32, replayed bool) []slog.Attr {
	return []slog.Attr{
		slog.String("run_id", l.run.in.RunID),
		slog.Int("step", l.run.steps),
		slog.String("tool", l.call.Name),
		slog.String("call_id", l.call.ID),
		slog.Int64("attempt", int64(attempt)),
		slog.Bool("replayed", replayed),
		slog.String("args_sha256", l.sha),
	}
}

// start writes tool_start and returns the start time.
func (l logCall) start(ctx context.Context, attempt uint32, replayed bool) time.Time {
	l.run.log.LogAttrs(ctx, slog.LevelInfo, "tool_start", l.attrs(attempt, replayed)...)
	return time.Now()
}

// end writes tool_end.
func (l logCall) end(ctx context.Context, attempt uint32, replayed bool, started time.Time, ok bool) {
	a := append(l.attrs(attempt, replayed),
		slog.Int64("duration_ms", time.Since(started).Milliseconds()),
		slog.Bool("ok", ok))
	l.run.log.LogAttrs(ctx, slog.LevelInfo, "tool_end", a...)
}
