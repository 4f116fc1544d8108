package server

import (
	"context"
	"math"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/ledger"
)

// StartRun implements ledger.v1.LedgerService.
func (h *handler) StartRun(ctx context.Context, req *ledgerv1.StartRunRequest) (*ledgerv1.StartRunResponse, error) {
	logRun(ctx, req.GetRunId())
	r, err := h.l.StartRun(ctx, h.principal(ctx), req.GetRunId(), fromRunLimits(req.GetLimits()))
	if err != nil {
		return nil, h.fail(ctx, err)
	}
	return &ledgerv1.StartRunResponse{Run: toRunProto(r)}, nil
}

// GetRun implements ledger.v1.LedgerService.
func (h *handler) GetRun(ctx context.Context, req *ledgerv1.GetRunRequest) (*ledgerv1.GetRunResponse, error) {
	logRun(ctx, req.GetRunId())
	r, err := h.l.GetRun(ctx, h.principal(ctx), req.GetRunId())
	if err != nil {
		return nil, h.fail(ctx, err)
	}
	return &ledgerv1.GetRunResponse{Run: toRunProto(r)}, nil
}

// EndRun implements ledger.v1.LedgerService.
func (h *handler) EndRun(ctx context.Context, req *ledgerv1.EndRunRequest) (*ledgerv1.EndRunResponse, error) {
	logRun(ctx, req.GetRunId())
	r, err := h.l.EndRun(ctx, h.principal(ctx), req.GetRunId(), ledger.RunState(enum8(req.GetState())), req.GetReason())
	if err != nil {
		return nil, h.fail(ctx, err)
	}
	return &ledgerv1.EndRunResponse{Run: toRunProto(r)}, nil
}

// ListRuns implements ledger.v1.LedgerService.
func (h *handler) ListRuns(ctx context.Context, req *ledgerv1.ListRunsRequest) (*ledgerv1.ListRunsResponse, error) {
	size := min(req.GetPageSize(), ledger.MaxRunPageSize+1) // above the most: refused by the ledger
	states := make([]ledger.RunState, len(req.GetStates()))
	for i, st := range req.GetStates() {
		states[i] = ledger.RunState(enum8(st))
	}
	page, err := h.l.ListRuns(ctx, h.principal(ctx), int(size), req.GetPageToken(), states...)
	if err != nil {
		return nil, h.fail(ctx, err)
	}
	resp := &ledgerv1.ListRunsResponse{NextPageToken: page.NextPageToken}
	for _, r := range page.Runs {
		resp.Runs = append(resp.Runs, toRunProto(r))
	}
	return resp, nil
}

// logRun puts the run id on the call's log line and span.
func logRun(ctx context.Context, id string) {
	annotate(ctx, nil, []string{"ledger.run_id", bounded(id, ledger.MaxRunIDLen)})
}

// fromRunLimits converts limits from the wire; a count above what the
// ledger accepts stays above it, so the ledger refuses it.
func fromRunLimits(l *ledgerv1.RunLimits) ledger.RunLimits {
	count := func(n uint32) int { return int(min(uint64(n), ledger.MaxRunCount+1)) }
	var d time.Duration
	if pd := l.GetDeadline(); pd != nil {
		if d = pd.AsDuration(); d < 0 || d == math.MaxInt64 {
			d = -1 // refused by the ledger
		}
	}
	return ledger.RunLimits{MaxSteps: count(l.GetMaxSteps()), Deadline: d, MaxRepeats: count(l.GetMaxRepeats()),
		MaxIrreversible: count(l.GetMaxIrreversible())}
}

// toRunProto converts a run for the wire.
func toRunProto(r *ledger.Run) *ledgerv1.Run {
	if r == nil {
		return nil
	}
	p := &ledgerv1.Run{
		RunId: r.ID,
		State: ledgerv1.RunState(r.State),
		Limits: &ledgerv1.RunLimits{MaxSteps: uint32(r.Limits.MaxSteps), MaxRepeats: uint32(r.Limits.MaxRepeats),
			MaxIrreversible: uint32(r.Limits.MaxIrreversible)},
		Steps:             uint32(r.Steps),
		IrreversibleSteps: uint32(r.IrreversibleSteps),
		MostRepeats:       uint32(r.MostRepeats),
		OpenOperations:    uint32(r.Open),
		StartedAt:         timestamp(r.StartedAt),
		DeadlineAt:        timestamp(r.DeadlineAt),
		EndedAt:           timestamp(r.EndedAt),
		EndReason:         r.EndReason,
		Implicit:          r.Implicit,
		StartedBy:         r.StartedBy,
	}
	if r.Limits.Deadline > 0 {
		p.Limits.Deadline = durationpb.New(r.Limits.Deadline)
	}
	return p
}

// runEndedStatus is the status of a refusal by a run that has ended: the
// reason of its final state, with the state, its steps and, when this call
// reached it, the limit.
func runEndedStatus(e *ledger.Error) *status.Status {
	md := map[string]string{"run_state": "RUN_STATE_UNSPECIFIED"}
	state := ledger.RunStateUnspecified
	if r := e.Run; r != nil {
		state = r.State
		md["run_state"] = ledgerv1.RunState(r.State).String()
		md["steps"] = strconv.Itoa(r.Steps)
	}
	msg := "the run has ended (" + md["run_state"] + "): it admits no new operation; what its operations report is still accepted"
	if e.Limit != "" {
		md["limit"] = e.Limit
		msg = "this new operation would pass the run's " + e.Limit + "; the run has ended (" + md["run_state"] + ")"
	}
	switch state {
	case ledger.RunStateStepLimit:
		return withDetails(codes.FailedPrecondition, msg, info(ReasonRunStepLimit, md))
	case ledger.RunStateDeadline:
		return withDetails(codes.FailedPrecondition, msg, info(ReasonRunDeadline, md))
	case ledger.RunStateRepetition:
		return withDetails(codes.FailedPrecondition, msg, info(ReasonRunRepetition, md))
	}
	return withDetails(codes.FailedPrecondition, msg, info(ReasonRunEnded, md))
}
