package server_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// TestRunsOverTheWire: the run RPCs and each refusal of a run's step on the
// wire: its code, ErrorInfo reason and metadata, and the run's fields.
func TestRunsOverTheWire(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		step := func(run, id string, p map[string]any) error {
			req := reserveReq(e.id(id), "payments.refund", mustStruct(t, p), newHolder())
			req.RunId = e.id(run)
			_, err := e.c.Reserve(e.ctx, req)
			return err
		}
		start := func(run string, lim *ledgerv1.RunLimits) *ledgerv1.Run {
			t.Helper()
			r, err := e.c.StartRun(e.ctx, &ledgerv1.StartRunRequest{RunId: e.id(run), Limits: lim})
			if err != nil {
				t.Fatalf("StartRun(%s): %v", run, err)
			}
			return r.Run
		}
		refused := func(err error, reason, state, limit string) {
			t.Helper()
			ei := wantReason(t, err, codes.FailedPrecondition, reason)
			if ei.Metadata["run_state"] != state || ei.Metadata["limit"] != limit || ei.Metadata["steps"] == "" {
				t.Fatalf("%s: metadata %v, want run_state %s, limit %q", reason, ei.Metadata, state, limit)
			}
		}

		r := start("steps", &ledgerv1.RunLimits{MaxSteps: 1, MaxRepeats: 4, Deadline: durationpb.New(time.Hour)})
		if r.State != ledgerv1.RunState_RUN_STATE_RUNNING || r.Limits.GetMaxSteps() != 1 || r.Limits.GetMaxRepeats() != 4 ||
			r.Limits.GetDeadline().AsDuration() != time.Hour || r.StartedAt == nil || r.DeadlineAt == nil || r.EndedAt != nil ||
			r.StartedBy != "anonymous" || r.RunId != e.id("steps") {
			t.Fatalf("StartRun = %v", r)
		}
		if err := step("steps", "s-1", map[string]any{"amount": 1}); err != nil {
			t.Fatal(err)
		}
		refused(step("steps", "s-2", map[string]any{"amount": 2}), "RUN_STEP_LIMIT", "RUN_STATE_STEP_LIMIT", "max_steps")
		refused(step("steps", "s-3", map[string]any{"amount": 3}), "RUN_STEP_LIMIT", "RUN_STATE_STEP_LIMIT", "")
		g, err := e.c.GetRun(e.ctx, &ledgerv1.GetRunRequest{RunId: e.id("steps")})
		if err != nil || g.Run.State != ledgerv1.RunState_RUN_STATE_STEP_LIMIT || g.Run.Steps != 1 || g.Run.OpenOperations != 1 ||
			g.Run.EndedAt == nil || !strings.Contains(g.Run.EndReason, "max_steps") {
			t.Fatalf("GetRun = %v, %v", g.GetRun(), err)
		}

		start("repeats", &ledgerv1.RunLimits{MaxRepeats: 1})
		if err := step("repeats", "r-1", map[string]any{"amount": 1}); err != nil {
			t.Fatal(err)
		}
		refused(step("repeats", "r-2", map[string]any{"amount": 1}), "RUN_REPETITION", "RUN_STATE_REPETITION", "max_repeats")

		start("timed", &ledgerv1.RunLimits{Deadline: durationpb.New(20 * time.Millisecond)})
		time.Sleep(50 * time.Millisecond)
		refused(step("timed", "t-1", map[string]any{"amount": 1}), "RUN_DEADLINE", "RUN_STATE_DEADLINE", "deadline")

		start("ended", nil)
		end, err := e.c.EndRun(e.ctx, &ledgerv1.EndRunRequest{RunId: e.id("ended"), State: ledgerv1.RunState_RUN_STATE_CANCELLED, Reason: "operator"})
		if err != nil || end.Run.State != ledgerv1.RunState_RUN_STATE_CANCELLED || end.Run.EndReason != "operator" {
			t.Fatalf("EndRun = %v, %v", end.GetRun(), err)
		}
		refused(step("ended", "e-1", map[string]any{"amount": 1}), "RUN_ENDED", "RUN_STATE_CANCELLED", "")
		_, err = e.c.EndRun(e.ctx, &ledgerv1.EndRunRequest{RunId: e.id("ended"), State: ledgerv1.RunState_RUN_STATE_DONE})
		if ei := wantReason(t, err, codes.FailedPrecondition, "RUN_ENDED"); ei.Metadata["run_state"] != "RUN_STATE_CANCELLED" {
			t.Fatalf("EndRun of an ended run: metadata %v", ei.Metadata)
		}

		list, err := e.c.ListRuns(e.ctx, &ledgerv1.ListRunsRequest{PageSize: 2})
		if err != nil || len(list.Runs) != 2 || list.NextPageToken == "" {
			t.Fatalf("ListRuns = %v, %v", list, err)
		}
		guarded := []ledgerv1.RunState{ledgerv1.RunState_RUN_STATE_STEP_LIMIT, ledgerv1.RunState_RUN_STATE_REPETITION}
		list, err = e.c.ListRuns(e.ctx, &ledgerv1.ListRunsRequest{PageSize: 500, States: guarded})
		var ids []string
		for _, r := range list.GetRuns() {
			if !slices.Contains(guarded, r.State) {
				t.Errorf("ListRuns of %v: %s is %v", guarded, r.RunId, r.State)
			}
			ids = append(ids, r.RunId)
		}
		if err != nil || !slices.Contains(ids, e.id("steps")) || !slices.Contains(ids, e.id("repeats")) || slices.Contains(ids, e.id("ended")) {
			t.Fatalf("ListRuns of %v = %v, %v", guarded, ids, err)
		}
		for _, req := range []*ledgerv1.ListRunsRequest{
			{PageSize: 1 << 31},
			{States: []ledgerv1.RunState{ledgerv1.RunState_RUN_STATE_UNSPECIFIED}},
			{States: []ledgerv1.RunState{ledgerv1.RunState_RUN_STATE_DONE, 99}},
		} {
			_, err = e.c.ListRuns(e.ctx, req)
			wantReason(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		}
		_, err = e.c.StartRun(e.ctx, &ledgerv1.StartRunRequest{RunId: e.id("steps"), Limits: &ledgerv1.RunLimits{MaxSteps: 2}})
		if ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED"); ei.Metadata["differs"] != "limits" {
			t.Fatalf("StartRun with other limits: metadata %v", ei.Metadata)
		}
		_, err = e.c.GetRun(e.ctx, &ledgerv1.GetRunRequest{RunId: e.id("never")})
		wantReason(t, err, codes.NotFound, "NOT_FOUND")
		if msg := status.Convert(err).Message(); msg != "no such run" {
			t.Fatalf("GetRun of no run: %q", msg)
		}
		for _, req := range []*ledgerv1.EndRunRequest{
			{RunId: e.id("steps")},
			{RunId: e.id("steps"), State: ledgerv1.RunState_RUN_STATE_DEADLINE},
			{RunId: e.id("steps"), State: ledgerv1.RunState(99)},
			{State: ledgerv1.RunState_RUN_STATE_DONE},
		} {
			_, err := e.c.EndRun(e.ctx, req)
			wantReason(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		}
		for _, lim := range []*ledgerv1.RunLimits{{Deadline: durationpb.New(-time.Second)}, {MaxSteps: 1 << 31}, {Deadline: &durationpb.Duration{Seconds: 1 << 62}}} {
			_, err := e.c.StartRun(e.ctx, &ledgerv1.StartRunRequest{RunId: e.id("bad"), Limits: lim})
			wantReason(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		}
	})
}
