package client

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// RunState is where a run is (ledger.v1.RunState).
type RunState = ledgerv1.RunState

// The run states. Every one but RunRunning is final.
const (
	RunRunning    = ledgerv1.RunState_RUN_STATE_RUNNING
	RunDone       = ledgerv1.RunState_RUN_STATE_DONE
	RunStepLimit  = ledgerv1.RunState_RUN_STATE_STEP_LIMIT
	RunDeadline   = ledgerv1.RunState_RUN_STATE_DEADLINE
	RunRepetition = ledgerv1.RunState_RUN_STATE_REPETITION
	RunCancelled  = ledgerv1.RunState_RUN_STATE_CANCELLED
)

// ErrRunEnded matches a Reserve refused by the ledger's run guard: the run
// ended, or this new operation would have passed its limit and ended it
// (reasons RUN_STEP_LIMIT, RUN_DEADLINE, RUN_REPETITION, RUN_ENDED). RunOf
// tells which. Do returns it without running the tool; an operation the
// run admitted before is never refused.
var ErrRunEnded = errors.New("run ended")

// RunLimits bound a run's steps (its new operations); zero is the tenant
// policy's.
type RunLimits struct {
	MaxSteps        uint32
	Deadline        time.Duration
	MaxRepeats      uint32 // of one tool with the same parameters; 2 refuses the third
	MaxIrreversible uint32
}

// Run is a run as the ledger records it.
type Run struct {
	ID                string
	State             RunState
	Limits            RunLimits
	Steps             uint32
	IrreversibleSteps uint32
	MostRepeats       uint32
	OpenOperations    uint32
	StartedAt         time.Time
	DeadlineAt        time.Time
	EndedAt           time.Time
	EndReason         string
	Implicit          bool
	StartedBy         string
}

// RunRefusal is what a refusal by the run guard says: the run's state, and
// the limit this call reached (empty when the run had ended before).
type RunRefusal struct {
	State RunState
	Limit string
}

// RunOf returns what err says about the run that refused it, when it is
// ErrRunEnded.
func RunOf(err error) (RunRefusal, bool) {
	var e *Error
	if !errors.As(err, &e) || e.sentinel != ErrRunEnded {
		return RunRefusal{}, false
	}
	return RunRefusal{State: RunState(ledgerv1.RunState_value[e.Metadata["run_state"]]), Limit: e.Metadata["limit"]}, true
}

// StartRun starts run id with limits; a repeat with the same limits returns
// the run, other limits are ErrKeyReused.
func (c *Client) StartRun(ctx context.Context, id string, l RunLimits) (*Run, error) {
	lim := &ledgerv1.RunLimits{MaxSteps: l.MaxSteps, MaxRepeats: l.MaxRepeats, MaxIrreversible: l.MaxIrreversible}
	if l.Deadline != 0 {
		lim.Deadline = durationpb.New(l.Deadline)
	}
	r, err := c.rpc.StartRun(ctx, &ledgerv1.StartRunRequest{RunId: id, Limits: lim})
	if err != nil {
		return nil, fromStatus(err)
	}
	return runFromProto(r.GetRun()), nil
}

// GetRun reads run id.
func (c *Client) GetRun(ctx context.Context, id string) (*Run, error) {
	r, err := c.rpc.GetRun(ctx, &ledgerv1.GetRunRequest{RunId: id})
	if err != nil {
		return nil, fromStatus(err)
	}
	return runFromProto(r.GetRun()), nil
}

// EndRun ends run id as RunDone or RunCancelled; the same end again
// returns the run, another is ErrRunEnded.
func (c *Client) EndRun(ctx context.Context, id string, state RunState, reason string) (*Run, error) {
	r, err := c.rpc.EndRun(ctx, &ledgerv1.EndRunRequest{RunId: id, State: state, Reason: reason})
	if err != nil {
		return nil, fromStatus(err)
	}
	return runFromProto(r.GetRun()), nil
}

// RunPage is one page of runs.
type RunPage struct {
	Runs          []*Run
	NextPageToken string
}

// ListRuns returns a page of the tenant's runs, running ones first; with
// states, only the runs in those states (a running run past its deadline
// is RunDeadline). A page may be short while NextPageToken is set.
func (c *Client) ListRuns(ctx context.Context, pageSize uint32, pageToken string, states ...RunState) (*RunPage, error) {
	r, err := c.rpc.ListRuns(ctx, &ledgerv1.ListRunsRequest{PageSize: pageSize, PageToken: pageToken, States: states})
	if err != nil {
		return nil, fromStatus(err)
	}
	p := &RunPage{NextPageToken: r.GetNextPageToken()}
	for _, run := range r.GetRuns() {
		p.Runs = append(p.Runs, runFromProto(run))
	}
	return p, nil
}

func runFromProto(p *ledgerv1.Run) *Run {
	if p == nil {
		return nil
	}
	l := p.GetLimits()
	return &Run{
		ID: p.GetRunId(), State: p.GetState(),
		Limits: RunLimits{MaxSteps: l.GetMaxSteps(), Deadline: l.GetDeadline().AsDuration(), MaxRepeats: l.GetMaxRepeats(),
			MaxIrreversible: l.GetMaxIrreversible()},
		Steps: p.GetSteps(), IrreversibleSteps: p.GetIrreversibleSteps(), MostRepeats: p.GetMostRepeats(),
		OpenOperations: p.GetOpenOperations(), StartedAt: ts(p.GetStartedAt()), DeadlineAt: ts(p.GetDeadlineAt()),
		EndedAt: ts(p.GetEndedAt()), EndReason: p.GetEndReason(), Implicit: p.GetImplicit(), StartedBy: p.GetStartedBy(),
	}
}
