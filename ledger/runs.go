package ledger

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/opledger/ledger/fingerprint"
)

// RunState is where a run is. Every state but RunStateRunning is final.
type RunState uint8

// The run states, numbered as on the wire.
const (
	RunStateUnspecified RunState = iota // not a state
	RunStateRunning                     // new steps are admitted within the limits
	RunStateDone                        // ended by EndRun: the work is done
	RunStateStepLimit                   // a new step would have passed max_steps or max_irreversible
	RunStateDeadline                    // the deadline passed
	RunStateRepetition                  // a tool would have run more than max_repeats times with one fingerprint
	RunStateCancelled                   // ended by EndRun: given up
)

var runStateNames = [...]string{"UNSPECIFIED", "RUNNING", "DONE", "STEP_LIMIT", "DEADLINE", "REPETITION", "CANCELLED"}

// String returns the state's name, as the wire's RUN_STATE_<name>.
func (s RunState) String() string {
	if int(s) < len(runStateNames) {
		return runStateNames[s]
	}
	return "RunState(" + itoa(int64(s)) + ")"
}

// RunLimits bound the steps of a run; zero means no limit.
type RunLimits struct {
	// MaxSteps is the most new operations the run may reserve.
	MaxSteps int
	// Deadline is how long after its start the run may reserve new
	// operations.
	Deadline time.Duration
	// MaxRepeats is the most new operations of one tool with one
	// fingerprint.
	MaxRepeats int
	// MaxIrreversible is the most new irreversible operations.
	MaxIrreversible int
}

// RunPolicy is how the ledger governs a tenant's runs.
type RunPolicy struct {
	// Limits are the limits of a run that asks for none, and the most a
	// StartRun may ask for (a zero one leaves that limit to the caller).
	Limits RunLimits
	// Implicit: a Reserve with a run id never started starts it with
	// Limits. Without it such a Reserve is not counted.
	Implicit bool
	// Retention is how long a run is kept after it ended (or its deadline
	// passed) and none of its operations is unresolved.
	Retention time.Duration
}

// DefaultRunPolicy governs no run nobody started, and keeps a run 7 days.
var DefaultRunPolicy = RunPolicy{Retention: 7 * 24 * time.Hour}

// Bounds of run limits.
const (
	MaxRunCount    = 1_000_000
	MaxRunDeadline = 30 * 24 * time.Hour
)

// Run is the snapshot of one run. Times come from the store's clock.
type Run struct {
	ID                string
	State             RunState
	Limits            RunLimits
	Steps             int // new operations admitted
	IrreversibleSteps int
	MostRepeats       int // the most steps of one tool with one fingerprint
	Open              int // admitted operations not known to be terminal
	StartedAt         time.Time
	DeadlineAt        time.Time // zero: no deadline
	EndedAt           time.Time // zero while running
	EndReason         string
	Implicit          bool   // started by its first Reserve
	StartedBy         string // the principal that started it
}

// limitsFor returns the limits of a run that asks for want under p: each
// zero one is p's; one above p's is a violation.
func (p RunPolicy) limitsFor(want RunLimits) (RunLimits, []Violation) {
	got := want
	var vs []Violation
	counts := []struct {
		field      string
		want, most int
		dst        *int
	}{
		{"limits.max_steps", want.MaxSteps, p.Limits.MaxSteps, &got.MaxSteps},
		{"limits.max_repeats", want.MaxRepeats, p.Limits.MaxRepeats, &got.MaxRepeats},
		{"limits.max_irreversible", want.MaxIrreversible, p.Limits.MaxIrreversible, &got.MaxIrreversible},
	}
	for _, c := range counts {
		switch {
		case c.want < 0 || c.want > MaxRunCount:
			vs = append(vs, Violation{c.field, "want 0 (the policy's) to " + itoa(MaxRunCount)})
		case c.want == 0:
			*c.dst = c.most
		case c.most > 0 && c.want > c.most:
			vs = append(vs, Violation{c.field, "more than the tenant's policy allows (" + itoa(int64(c.most)) + ")"})
		}
	}
	switch d, most := want.Deadline, p.Limits.Deadline; {
	case d < 0 || d > MaxRunDeadline:
		vs = append(vs, Violation{"limits.deadline", "want 0 (the policy's) to " + MaxRunDeadline.String()})
	case d == 0:
		got.Deadline = most
	case d < time.Millisecond:
		vs = append(vs, Violation{"limits.deadline", "shorter than 1ms"})
	case most > 0 && d > most:
		vs = append(vs, Violation{"limits.deadline", "longer than the tenant's policy allows (" + most.String() + ")"})
	}
	return got, vs
}

// StartRun starts run id with limits within the tenant's run policy (zero
// ones are the policy's). A repeat with the same limits answers the run as
// it is, whatever its state.
//
// May return an *Error of KindInvalid, KindKeyReused (the run exists with
// other limits; Differs is ["limits"], Run the run) or KindUnavailable.
func (l *Ledger) StartRun(ctx context.Context, who Principal, id string, limits RunLimits) (*Run, error) {
	const op = "ledger.StartRun"
	pol := l.policies.RunFor(who.Tenant)
	lim, vs := pol.limitsFor(limits)
	vs = append(append(checkPrincipal(who), violations(checkID("run_id", id, MaxRunIDLen, true))...), vs...)
	if len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	k := l.keys.run(who.Tenant, id)
	code, _, run, err := l.runScript(ctx, op, runStartScript, k, id, who.ID,
		lim.MaxSteps, lim.Deadline.Milliseconds(), lim.MaxRepeats, lim.MaxIrreversible, pol.Retention.Milliseconds())
	switch {
	case err != nil:
		return nil, err
	case code == codeKeyReused:
		return nil, &Error{Op: op, Kind: KindKeyReused, Differs: []string{"limits"}, Run: run}
	}
	l.started.add(k.all[0])
	return run, nil
}

// GetRun reads run id. A run whose deadline has passed is ended
// (RunStateDeadline) first.
//
// May return an *Error of KindInvalid, KindNotFound or KindUnavailable.
func (l *Ledger) GetRun(ctx context.Context, who Principal, id string) (*Run, error) {
	const op = "ledger.GetRun"
	if vs := append(checkPrincipal(who), violations(checkID("run_id", id, MaxRunIDLen, true))...); len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	code, aux, run, err := l.runScript(ctx, op, runGetScript, l.keys.run(who.Tenant, id), id)
	if err != nil {
		return nil, err
	}
	if code == codeNotFound {
		return nil, &Error{Op: op, Kind: KindNotFound}
	}
	if aux == "deadline" {
		l.runEnded("GetRun", who.Tenant, run)
	}
	return run, nil
}

// EndRun ends run id as RunStateDone or RunStateCancelled, for reason (a
// note for operators). The same end again answers the run as it is.
// Operations the run holds go on: their Complete, MarkUnknown and Reconcile
// are never refused.
//
// May return an *Error of KindInvalid, KindNotFound, KindRunEnded (it ended
// otherwise before; Run says how) or KindUnavailable.
func (l *Ledger) EndRun(ctx context.Context, who Principal, id string, state RunState, reason string) (*Run, error) {
	const op = "ledger.EndRun"
	vs := append(checkPrincipal(who), violations(checkID("run_id", id, MaxRunIDLen, true), checkText("reason", reason, MaxNoteLen))...)
	if state != RunStateDone && state != RunStateCancelled {
		vs = append(vs, Violation{"state", "want RUN_STATE_DONE or RUN_STATE_CANCELLED"})
	}
	if len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	code, aux, run, err := l.runScript(ctx, op, runEndScript, l.keys.run(who.Tenant, id), id, int(state), reason)
	switch {
	case err != nil:
		return nil, err
	case code == codeNotFound:
		return nil, &Error{Op: op, Kind: KindNotFound}
	case code == codeRunEnded:
		if aux == "deadline" {
			l.runEnded("EndRun", who.Tenant, run)
		}
		return nil, &Error{Op: op, Kind: KindRunEnded, Run: run}
	}
	if aux == "ended" {
		l.runEnded("EndRun", who.Tenant, run)
	}
	return run, nil
}

// admission is what the run guard said about one Reserve.
type admission struct {
	keys     runKeys
	runID    string
	governed bool // the run exists: the operation is tracked by it
	fresh    bool // a new step
}

// guardedRun leads the run id of a record whose run guard admitted it (a
// run id never holds a control character).
const guardedRun = "\x01"

// recordedRun is the run id a Reserve records with a new operation: marked
// when the run guard tracks it, so its terminal transition settles it in
// the run (and an untracked one costs no round trip then).
func (a admission) recordedRun(runID string) string {
	if a.governed {
		return guardedRun + runID
	}
	return runID
}

// admitStep asks the run guard of req.RunID whether the Reserve may go on
// (design.md §3.5). Without a run id it admits without a round trip; a run
// nobody started and no policy governs costs one EXISTS and no count.
func (l *Ledger) admitStep(ctx context.Context, op string, who Principal, req ReserveRequest, fp fingerprint.Fingerprint, effect Effect, pol Policy) (admission, error) {
	if req.RunID == "" {
		return admission{}, nil
	}
	rp := l.policies.RunFor(who.Tenant)
	k := l.keys.run(who.Tenant, req.RunID)
	if !rp.Implicit && !l.started.has(k.all[0]) {
		if exists, err := l.runExists(ctx, op, k); err != nil || !exists {
			return admission{}, err
		}
		l.started.add(k.all[0])
	}
	implicit := []any{"0"}
	if rp.Implicit {
		implicit = []any{"1", rp.Limits.MaxSteps, rp.Limits.Deadline.Milliseconds(), rp.Limits.MaxRepeats,
			rp.Limits.MaxIrreversible, rp.Retention.Milliseconds()}
	}
	irreversible := "0"
	if effect == EffectIrreversible {
		irreversible = "1"
	}
	args := append([]any{who.ID, req.OperationID, req.Tool, string(fp[:]), irreversible, pol.RunMaxRepeats}, implicit...)
	code, aux, run, err := l.runScript(ctx, op, runAdmitScript, k, req.RunID, args...)
	switch {
	case err != nil:
		return admission{}, err
	case code == codeUngoverned:
		l.started.drop(k.all[0])
		return admission{}, nil
	case code == codeRunEnded:
		if aux != "" {
			l.runEnded("Reserve", who.Tenant, run)
		}
		l.emit(Event{Type: EventRefused, Op: "Reserve", Tenant: who.Tenant, Tool: req.Tool, ErrKind: KindRunEnded, RunState: run.State})
		return admission{}, &Error{Op: op, Kind: KindRunEnded, Run: run, Limit: aux}
	}
	return admission{keys: k, runID: req.RunID, governed: true, fresh: aux == "new"}, nil
}

// runExists reports whether the run of k exists, by one EXISTS (sent by Do,
// so that the autopipeline batches it): a run id that no run governs costs
// no script.
func (l *Ledger) runExists(ctx context.Context, op string, k runKeys) (bool, error) {
	start := time.Now()
	n, err := l.rdb.Do(ctx, "exists", k.all[0]).Int64()
	return n > 0, l.reported(op, start, err)
}

// maxStartedRuns bounds startedRuns; a full set is emptied.
const maxStartedRuns = 10000

// startedRuns holds the record keys of runs this Ledger has seen exist, so
// that their steps skip runExists. A run that is gone again is dropped
// when the run guard says so; one missing here only costs an EXISTS.
type startedRuns struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

// has reports whether the run of key is known to exist.
func (s *startedRuns) has(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.keys[key]
	return ok
}

// add records that the run of key exists.
func (s *startedRuns) add(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil || len(s.keys) >= maxStartedRuns {
		s.keys = make(map[string]struct{})
	}
	s.keys[key] = struct{}{}
}

// drop forgets the run of key.
func (s *startedRuns) drop(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.keys, key)
}

// afterStep settles an admitted operation that no longer holds its run: it
// ended, it was created outside the run's guard (another run's, or before
// the run started), or this Reserve created nothing.
func (l *Ledger) afterStep(ctx context.Context, a admission, opID string, res *ReserveResult, err error) {
	if !a.governed {
		return
	}
	switch {
	case err != nil:
		switch KindOf(err) {
		case KindKeyReused, KindKeyExpired, KindQuotaExceeded:
			if a.fresh {
				l.settle(ctx, a.keys, a.runID, opID)
			}
		}
	case res.Operation.State.Terminal() || !res.Operation.runGuarded || res.Operation.RunID != a.runID:
		l.settle(ctx, a.keys, a.runID, opID)
	}
}

// settleOperation tells o's run that o is terminal, when it is.
func (l *Ledger) settleOperation(ctx context.Context, tenant string, o *Operation) {
	if o != nil && o.runGuarded && o.State.Terminal() {
		l.settle(ctx, l.keys.run(tenant, o.RunID), o.RunID, o.ID)
	}
}

// settle marks opID settled in its run. A failure leaves the run holding it
// (kept longer, never shorter); it is not the caller's failure.
func (l *Ledger) settle(ctx context.Context, k runKeys, runID, opID string) {
	_, _, _, _ = l.runScript(ctx, "ledger.settle", runSettleScript, k, runID, opID)
}

// runEnded reports that a call ended run.
func (l *Ledger) runEnded(op, tenant string, run *Run) {
	l.emit(Event{Type: EventRunEnded, Op: op, Tenant: tenant, RunState: run.State, Count: run.Steps})
}

// runScript runs a run script on k with the run's member and args, and
// returns its code, aux and the run it read (nil when there is none).
func (l *Ledger) runScript(ctx context.Context, op string, s *script, k runKeys, id string, args ...any) (int64, string, *Run, error) {
	marker := ""
	if l.waitN > 0 {
		marker = l.keys.wait(k.shard)
	}
	raw, err := l.evalReported(ctx, op, s, marker, k.all, append([]any{k.member}, args...))
	if err != nil && KindOf(err) != KindNotReplicated {
		return 0, "", nil, err
	}
	if len(raw) < 2 {
		return 0, "", nil, &Error{Op: op, Kind: KindOther, Err: fmt.Errorf("script returned %d values", len(raw))}
	}
	code, _ := raw[0].(int64)
	aux, _ := raw[1].(string)
	var run *Run
	if len(raw) == 2+len(runFields) {
		run = decodeRun(id, raw[2:])
	}
	return code, aux, run, err
}

// runFields are the fields a run script replies with (FIELDS in runs.lua).
var runFields = [...]string{"st", "ms", "dd", "mr", "mi", "n", "ni", "top", "ct", "dl", "et", "rsn", "imp", "by", "open", "ret"}

// decodeRun reads the fields of runFields.
func decodeRun(id string, f []any) *Run {
	s := func(i int) string { v, _ := f[i].(string); return v }
	n := func(i int) int64 { v, _ := strconv.ParseInt(s(i), 10, 64); return v }
	at := func(i int) time.Time {
		if ms := n(i); ms > 0 {
			return msTime(ms)
		}
		return time.Time{}
	}
	return &Run{
		ID:    id,
		State: RunState(n(0)),
		Limits: RunLimits{MaxSteps: int(n(1)), Deadline: time.Duration(n(2)) * time.Millisecond,
			MaxRepeats: int(n(3)), MaxIrreversible: int(n(4))},
		Steps: int(n(5)), IrreversibleSteps: int(n(6)), MostRepeats: int(n(7)),
		StartedAt: at(8), DeadlineAt: at(9), EndedAt: at(10), EndReason: s(11),
		Implicit: s(12) == "1", StartedBy: s(13), Open: int(n(14)),
	}
}
