package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/autopipe"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
)

// step reserves a new operation id of run with tool and params, as an
// agent's next tool call: it returns the decision, or the error.
func (e *env) step(t *testing.T, run, id, tool string, params map[string]any) (*ReserveResult, error) {
	t.Helper()
	return e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: id, Tool: tool, Params: params, PermitID: "permit-1",
		Holder: "h-" + id, RunID: run})
}

// wantRunEnded fails unless err is KindRunEnded with the run in state st,
// ended now by limit (empty: before).
func wantRunEnded(t *testing.T, err error, st RunState, limit string) *Run {
	t.Helper()
	le := wantKind(t, err, KindRunEnded)
	if le.Run == nil || le.Run.State != st || le.Limit != limit {
		t.Fatalf("run ended: %+v, limit %q; want state %v, limit %q", le.Run, le.Limit, st, limit)
	}
	return le.Run
}

func (e *env) startRun(t *testing.T, id string, lim RunLimits) *Run {
	t.Helper()
	r, err := e.l.StartRun(e.ctx, e.who, id, lim)
	if err != nil {
		t.Fatalf("StartRun(%s): %v", id, err)
	}
	return r
}

func (e *env) getRun(t *testing.T, id string) *Run {
	t.Helper()
	r, err := e.l.GetRun(e.ctx, e.who, id)
	if err != nil {
		t.Fatalf("GetRun(%s): %v", id, err)
	}
	return r
}

// TestRunLimits: each limit admits new steps up to it, refuses the next one
// with the limit's state and ends the run; a retry of an admitted operation
// is never a step, before the end or after it; what is in flight still
// completes.
func TestRunLimits(t *testing.T) {
	amount := func(n int) map[string]any { return map[string]any{"amount": float64(n)} }
	cases := []struct {
		name   string
		limits RunLimits
		// steps are the new calls: tool and amount; the last is refused.
		tools   []string
		amounts []int
		state   RunState
		limit   string
	}{
		{"max_steps", RunLimits{MaxSteps: 3}, []string{"payments.refund", "payments.refund", "idempotent.sync", "payments.refund"},
			[]int{1, 2, 3, 4}, RunStateStepLimit, "max_steps"},
		{"max_irreversible", RunLimits{MaxIrreversible: 2}, []string{"payments.refund", "idempotent.sync", "payments.refund", "idempotent.sync", "payments.charge"},
			[]int{1, 2, 3, 4, 5}, RunStateStepLimit, "max_irreversible"},
		{"max_repeats", RunLimits{MaxRepeats: 2}, []string{"payments.refund", "payments.refund", "payments.refund", "payments.refund"},
			[]int{7, 8, 7, 7}, RunStateRepetition, "max_repeats"},
		{"the tool's run_max_repeats", RunLimits{MaxRepeats: 5}, []string{"once.notify", "once.notify", "once.notify"},
			[]int{1, 2, 1}, RunStateRepetition, "max_repeats"},
	}
	eachBackend(t, func(t *testing.T, e *env) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				run := "run-" + c.name
				e.startRun(t, run, c.limits)
				last := len(c.tools) - 1
				var first *Operation
				for i := range last {
					res, err := e.step(t, run, run+"-op-"+itoa(int64(i)), c.tools[i], amount(c.amounts[i]))
					if err != nil || res.Decision != DecisionExecute {
						t.Fatalf("step %d: %+v, %v; want EXECUTE", i, res, err)
					}
					if i == 0 {
						first = res.Operation
					}
					// The lost response's retry is the same step.
					if again, err := e.step(t, run, run+"-op-"+itoa(int64(i)), c.tools[i], amount(c.amounts[i])); err != nil || again.Decision != DecisionExecute {
						t.Fatalf("step %d again: %+v, %v", i, again, err)
					}
				}
				if r := e.getRun(t, run); r.Steps != last || r.State != RunStateRunning || r.Open != last {
					t.Fatalf("run before the limit: %+v", r)
				}
				_, err := e.step(t, run, run+"-op-last", c.tools[last], amount(c.amounts[last]))
				r := wantRunEnded(t, err, c.state, c.limit)
				if r.Steps != last || r.EndedAt.IsZero() || r.EndReason == "" {
					t.Fatalf("the run the refusal reports: %+v", r)
				}
				if _, err := e.l.Lookup(e.ctx, e.who, run+"-op-last"); KindOf(err) != KindNotFound {
					t.Fatalf("the refused step left an operation: %v", err)
				}
				// Ended: another new step is refused as well, and says so.
				_, err = e.step(t, run, run+"-op-after", "payments.refund", amount(99))
				wantRunEnded(t, err, c.state, "")
				// What was admitted goes on: a retry, and its outcome.
				if again, err := e.step(t, run, run+"-op-0", c.tools[0], amount(c.amounts[0])); err != nil || again.Decision != DecisionExecute {
					t.Fatalf("a retry after the end: %+v, %v", again, err)
				}
				e.settle(t, run+"-op-0", first.FencingToken, OutcomeSucceeded, "R-1")
				if r := e.getRun(t, run); r.State != c.state || r.Steps != last || r.Open != last-1 {
					t.Fatalf("run at the end: %+v", r)
				}
			})
		}
	})
}

// TestRunStepCapUnderRace: 64 workers of one run racing with new
// operations against a cap of 10 create exactly 10.
func TestRunStepCapUnderRace(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		e.startRun(t, "race", RunLimits{MaxSteps: 10})
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			executed int
			refused  int
		)
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := e.step(t, "race", "race-"+itoa(int64(i)), "payments.refund", map[string]any{"amount": float64(i)})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && res.Decision == DecisionExecute:
					executed++
				case KindOf(err) == KindRunEnded:
					refused++
				default:
					t.Errorf("worker %d: %+v, %v", i, res, err)
				}
			}()
		}
		wg.Wait()
		if executed != 10 || refused != 54 {
			t.Fatalf("%d executed, %d refused; want 10 and 54", executed, refused)
		}
		records := 0
		for i := range 64 {
			if _, err := e.l.Lookup(e.ctx, e.who, "race-"+itoa(int64(i))); err == nil {
				records++
			}
		}
		if records != 10 {
			t.Fatalf("%d operation records, want 10", records)
		}
		if r := e.getRun(t, "race"); r.Steps != 10 || r.State != RunStateStepLimit {
			t.Fatalf("run = %+v", r)
		}
	})
}

// TestRunDeadline: past the deadline a new step is refused and the run
// ends; the operation running across it still completes. The deadline is
// 1s, so that a stalled machine does not pass it before the first step.
func TestRunDeadline(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		r := e.startRun(t, "timed", RunLimits{Deadline: time.Second})
		if !r.DeadlineAt.Equal(r.StartedAt.Add(time.Second)) || r.State != RunStateRunning {
			t.Fatalf("run = %+v", r)
		}
		res, err := e.step(t, "timed", "long", "payments.refund", map[string]any{"amount": 1.0})
		if err != nil || res.Decision != DecisionExecute {
			t.Fatalf("the first step: %+v, %v", res, err)
		}
		time.Sleep(time.Until(r.DeadlineAt) + 50*time.Millisecond)
		_, err = e.step(t, "timed", "late", "payments.refund", map[string]any{"amount": 2.0})
		wantRunEnded(t, err, RunStateDeadline, "deadline")
		if done := e.settle(t, "long", res.Operation.FencingToken, OutcomeSucceeded, "R-1"); done.State != StateSucceeded {
			t.Fatalf("Complete across the deadline = %+v", done)
		}
		if r := e.getRun(t, "timed"); r.State != RunStateDeadline || r.Open != 0 || r.Steps != 1 {
			t.Fatalf("run = %+v", r)
		}
		// GetRun ends a run whose deadline passed without a step.
		e.startRun(t, "idle", RunLimits{Deadline: 50 * time.Millisecond})
		time.Sleep(100 * time.Millisecond)
		if r := e.getRun(t, "idle"); r.State != RunStateDeadline || r.EndedAt.IsZero() {
			t.Fatalf("idle run past its deadline = %+v", r)
		}
	})
}

// TestStartAndEndRun: StartRun's repeat, its limits within the policy, and
// EndRun's ends.
func TestStartAndEndRun(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		r := e.startRun(t, "r", RunLimits{MaxSteps: 4, MaxRepeats: 2})
		if r.State != RunStateRunning || r.Limits != (RunLimits{MaxSteps: 4, MaxRepeats: 2}) || r.StartedBy != "agent-1" || r.Implicit {
			t.Fatalf("StartRun = %+v", r)
		}
		if again := e.startRun(t, "r", RunLimits{MaxSteps: 4, MaxRepeats: 2}); again.StartedAt != r.StartedAt {
			t.Fatalf("StartRun again = %+v, want the run as it was", again)
		}
		_, err := e.l.StartRun(e.ctx, e.who, "r", RunLimits{MaxSteps: 5})
		if le := wantKind(t, err, KindKeyReused); len(le.Differs) != 1 || le.Differs[0] != "limits" || le.Run.Limits.MaxSteps != 4 {
			t.Fatalf("StartRun with other limits: %+v", le)
		}
		for _, bad := range []RunLimits{{MaxSteps: -1}, {Deadline: -time.Second}, {MaxRepeats: MaxRunCount + 1}, {Deadline: MaxRunDeadline + 1}} {
			_, err := e.l.StartRun(e.ctx, e.who, "bad", bad)
			wantKind(t, err, KindInvalid)
		}
		_, err = e.l.StartRun(e.ctx, e.who, "", RunLimits{})
		wantKind(t, err, KindInvalid)
		_, err = e.l.GetRun(e.ctx, e.who, "never")
		wantKind(t, err, KindNotFound)

		res, err := e.step(t, "r", "r-1", "payments.refund", map[string]any{"amount": 1.0})
		if err != nil || res.Decision != DecisionExecute {
			t.Fatalf("step: %+v, %v", res, err)
		}
		done, err := e.l.EndRun(e.ctx, e.who, "r", RunStateDone, "all done")
		if err != nil || done.State != RunStateDone || done.EndReason != "all done" || done.EndedAt.IsZero() {
			t.Fatalf("EndRun = %+v, %v", done, err)
		}
		if again, err := e.l.EndRun(e.ctx, e.who, "r", RunStateDone, "all done"); err != nil || again.EndedAt != done.EndedAt {
			t.Fatalf("EndRun again = %+v, %v", again, err)
		}
		_, err = e.l.EndRun(e.ctx, e.who, "r", RunStateCancelled, "changed my mind")
		wantRunEnded(t, err, RunStateDone, "")
		_, err = e.step(t, "r", "r-2", "payments.refund", map[string]any{"amount": 2.0})
		wantRunEnded(t, err, RunStateDone, "")
		// The ended run strands nothing: the claim's outcome is recorded.
		if o := e.unknown(t, "r-1", res.Operation.FencingToken); o.State != StateUnknown {
			t.Fatalf("MarkUnknown after EndRun = %+v", o)
		}
		if o, err := e.reconcileAs(t, "r-1", FindingApplied); err != nil || o.State != StateSucceeded {
			t.Fatalf("Reconcile after EndRun = %+v, %v", o, err)
		}
		for _, st := range []RunState{RunStateUnspecified, RunStateRunning, RunStateStepLimit} {
			_, err := e.l.EndRun(e.ctx, e.who, "r", st, "")
			wantKind(t, err, KindInvalid)
		}
		_, err = e.l.EndRun(e.ctx, e.who, "never", RunStateCancelled, "")
		wantKind(t, err, KindNotFound)
	})
}

// TestRunPolicy: a tenant's policy sets the limits of a run that asks for
// none and bounds those it asks for; with implicit, a run id nobody started
// is governed; without, it is not counted at all.
func TestRunPolicy(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		t.Run("implicit", func(t *testing.T) {
			e := *e
			e.who.Tenant = "implicit-" + randomHex(4)
			for i := range 5 {
				if _, err := e.step(t, "auto", "auto-"+itoa(int64(i)), "payments.refund", map[string]any{"amount": float64(i)}); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			_, err := e.step(t, "auto", "auto-5", "payments.refund", map[string]any{"amount": 5.0})
			r := wantRunEnded(t, err, RunStateStepLimit, "max_steps")
			if !r.Implicit || r.Limits != (RunLimits{MaxSteps: 5, Deadline: time.Minute, MaxRepeats: 2}) || r.DeadlineAt.IsZero() {
				t.Fatalf("implicit run = %+v", r)
			}
		})
		t.Run("capped", func(t *testing.T) {
			e := *e
			e.who.Tenant = "capped-" + randomHex(4)
			r := e.startRun(t, "c", RunLimits{})
			if r.Limits != (RunLimits{MaxSteps: 20, Deadline: time.Hour}) {
				t.Fatalf("limits of a run that asks for none = %+v", r.Limits)
			}
			_, err := e.l.StartRun(e.ctx, e.who, "d", RunLimits{MaxSteps: 21, Deadline: 2 * time.Hour})
			if le := wantKind(t, err, KindInvalid); len(le.Violations) != 2 || le.Violations[0].Field != "limits.max_steps" ||
				le.Violations[1].Field != "limits.deadline" {
				t.Fatalf("limits above the policy: %+v", le.Violations)
			}
			if r := e.startRun(t, "e", RunLimits{MaxSteps: 3, MaxRepeats: 9}); r.Limits != (RunLimits{MaxSteps: 3, Deadline: time.Hour, MaxRepeats: 9}) {
				t.Fatalf("limits within the policy = %+v", r.Limits)
			}
		})
		t.Run("ungoverned", func(t *testing.T) {
			for i := range 30 {
				if _, err := e.step(t, "free", "free-"+itoa(int64(i)), "payments.refund", map[string]any{"amount": 1.0}); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			_, err := e.l.GetRun(e.ctx, e.who, "free")
			wantKind(t, err, KindNotFound)
		})
	})
}

// TestRunsKeepToTheirTenant: one run id in two tenants is two runs.
func TestRunsKeepToTheirTenant(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		other := *e
		other.who.Tenant = e.who.Tenant + "-other"
		e.startRun(t, "shared", RunLimits{MaxSteps: 1})
		other.startRun(t, "shared", RunLimits{MaxSteps: 2})
		if _, err := e.step(t, "shared", "a", "payments.refund", map[string]any{"amount": 1.0}); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a", "b"} {
			if _, err := other.step(t, "shared", id, "payments.refund", map[string]any{"amount": 1.0}); err != nil {
				t.Fatalf("the other tenant's step %s: %v", id, err)
			}
		}
		_, err := e.step(t, "shared", "b", "payments.refund", map[string]any{"amount": 1.0})
		wantRunEnded(t, err, RunStateStepLimit, "max_steps")
		if r := other.getRun(t, "shared"); r.Steps != 2 || r.State != RunStateRunning {
			t.Fatalf("the other tenant's run = %+v", r)
		}
	})
}

// TestRunRetention: a run is kept while it may still admit a step or one
// of its operations is unresolved, and for its retention after that.
func TestRunRetention(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ttl := func(run string) time.Duration {
			t.Helper()
			d, err := e.rdb.PTTL(e.ctx, e.l.keys.run(e.who.Tenant, run).all[0]).Result()
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		week := DefaultRunPolicy.Retention
		e.startRun(t, "open", RunLimits{})
		if d := ttl("open"); d != -1 {
			t.Fatalf("a run without a deadline or an end has TTL %v", d)
		}
		r := e.startRun(t, "timed", RunLimits{Deadline: time.Hour})
		if d := ttl("timed"); d < week || d > week+time.Hour {
			t.Fatalf("a run with a deadline and nothing open has TTL %v, want its deadline plus %v", d, week)
		}
		res, err := e.step(t, "timed", "t-1", "payments.refund", map[string]any{"amount": 1.0})
		if err != nil {
			t.Fatal(err)
		}
		if d := ttl("timed"); d != -1 {
			t.Fatalf("a running run holding an unresolved operation has TTL %v", d)
		}
		if _, err := e.l.EndRun(e.ctx, e.who, "timed", RunStateCancelled, "stop"); err != nil {
			t.Fatal(err)
		}
		if d := ttl("timed"); d != -1 {
			t.Fatalf("an ended run holding an unresolved operation has TTL %v", d)
		}
		e.unknown(t, "t-1", res.Operation.FencingToken)
		if d := ttl("timed"); d != -1 {
			t.Fatalf("an ended run holding an UNKNOWN operation has TTL %v", d)
		}
		if _, err := e.reconcileAs(t, "t-1", FindingAbandon); err != nil {
			t.Fatal(err)
		}
		if d := ttl("timed"); d < week-time.Minute || d > week {
			t.Fatalf("an ended run with nothing open has TTL %v, want about %v", d, week)
		}
		if got := e.getRun(t, "timed"); got.Open != 0 || !got.StartedAt.Equal(r.StartedAt) {
			t.Fatalf("run = %+v", got)
		}
	})
}

// TestRunForgottenAfterItsRetention: once a run's record is gone (its
// retention over), its id is a run nobody started: a step under it is
// admitted, ungoverned, and the ledger no longer takes the run for one it
// has seen, so it asks the store again on the next step.
func TestRunForgottenAfterItsRetention(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		e.startRun(t, "brief-run", RunLimits{MaxSteps: 1})
		first, err := e.step(t, "brief-run", "s-1", "payments.refund", map[string]any{"amount": 1.0})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.complete(t, "s-1", first.Operation.FencingToken, OutcomeSucceeded, nil, nil); err != nil {
			t.Fatal(err)
		}
		key := e.l.keys.run(e.who.Tenant, "brief-run").all[0]
		if !e.l.started.has(key) {
			t.Fatal("the ledger does not hold the run it saw start")
		}
		if err := e.rdb.Del(e.ctx, key).Err(); err != nil { // as its retention would
			t.Fatal(err)
		}
		second, err := e.step(t, "brief-run", "s-2", "payments.refund", map[string]any{"amount": 2.0})
		if err != nil || second.Decision != DecisionExecute {
			t.Fatalf("a step past the forgotten run's cap = %+v, %v; want it admitted", second, err)
		}
		if e.l.started.has(key) {
			t.Fatal("the ledger still takes the forgotten run for one it has seen")
		}
	})
}

// TestRunFieldNotANumber: a run script converts the fields it reads before
// its first write, so a stored field that is no number (a manual edit)
// makes the settling of an operation write nothing, where it would
// otherwise have settled the operation under a retention read as 0.
func TestRunFieldNotANumber(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		e.startRun(t, "edited", RunLimits{Deadline: time.Hour})
		res, err := e.step(t, "edited", "e-1", "payments.refund", map[string]any{"amount": 1.0})
		if err != nil {
			t.Fatal(err)
		}
		key := e.l.keys.run(e.who.Tenant, "edited").all[0]
		if err := e.rdb.HSet(e.ctx, key, "ret", "a week").Err(); err != nil {
			t.Fatal(err)
		}
		before := keyDump(t, e.rdb, key)
		if _, err := e.complete(t, "e-1", res.Operation.FencingToken, OutcomeSucceeded, nil, nil); err != nil {
			t.Fatal(err)
		}
		if after := keyDump(t, e.rdb, key); after != before {
			t.Fatalf("run record changed:\nbefore %q\nafter  %q", before, after)
		}
		if d := e.rdb.PTTL(e.ctx, key).Val(); d != -1 {
			t.Fatalf("run record has TTL %v, want none while it holds an open operation", d)
		}
	})
}

// TestRunEndedIsRunEnded: errors.Is matches the kind's sentinel.
func TestRunEndedIsRunEnded(t *testing.T) {
	err := error(&Error{Op: "ledger.Reserve", Kind: KindRunEnded, Run: &Run{State: RunStateDeadline}})
	if !errors.Is(err, ErrRunEnded) || errors.Is(err, ErrNotFound) {
		t.Fatal("errors.Is does not tell KindRunEnded")
	}
}

// TestRunEvents: the observer hears each end of a run once, with its state
// and steps, and each refused step with the run's state.
func TestRunEvents(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		seen := observe(t, e)
		e.startRun(t, "capped", RunLimits{MaxSteps: 1})
		for _, id := range []string{"a", "b", "c"} {
			_, _ = e.step(t, "capped", id, "payments.refund", map[string]any{"amount": 1.0})
		}
		e.startRun(t, "done", RunLimits{})
		for range 2 {
			_, _ = e.l.EndRun(e.ctx, e.who, "done", RunStateDone, "")
		}
		e.startRun(t, "timed", RunLimits{Deadline: 10 * time.Millisecond})
		time.Sleep(30 * time.Millisecond)
		e.getRun(t, "timed")
		e.getRun(t, "timed")
		var got []string
		for _, ev := range seen() {
			switch ev.Type {
			case EventRunEnded:
				got = append(got, "ended:"+ev.Op+":"+ev.RunState.String()+":"+itoa(int64(ev.Count)))
			case EventRefused:
				got = append(got, "refused:"+ev.Op+":"+ev.RunState.String())
			}
		}
		want := []string{"ended:Reserve:STEP_LIMIT:1", "refused:Reserve:STEP_LIMIT", "refused:Reserve:STEP_LIMIT",
			"ended:EndRun:DONE:0", "ended:GetRun:DEADLINE:0"}
		if !slices.Equal(got, want) {
			t.Fatalf("events %v, want %v", got, want)
		}
	})
}

// TestSettleCostsOnlyGuardedOperations: an operation whose run nobody
// started is not settled when it ends (no round trip); a guarded one is,
// once; one created before its run started is not held by the run.
func TestSettleCostsOnlyGuardedOperations(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		seen := observe(t, e)
		settles := func() int {
			n := 0
			for _, ev := range seen() {
				if ev.Type == EventScript && ev.Op == "settle" {
					n++
				}
			}
			return n
		}
		res, err := e.step(t, "free", "free-1", "payments.refund", map[string]any{"amount": 1.0})
		if err != nil {
			t.Fatal(err)
		}
		e.settle(t, "free-1", res.Operation.FencingToken, OutcomeSucceeded, "R-1")
		if got := e.lookup(t, "free-1"); got.RunID != "free" || settles() != 0 {
			t.Fatalf("an ungoverned run's operation: run id %q, %d settles; want free, 0", got.RunID, settles())
		}
		e.startRun(t, "guarded", RunLimits{})
		res, err = e.step(t, "guarded", "g-1", "payments.refund", map[string]any{"amount": 1.0})
		if err != nil {
			t.Fatal(err)
		}
		if res.Operation.RunID != "guarded" {
			t.Fatalf("run id %q on the wire, want guarded", res.Operation.RunID)
		}
		e.settle(t, "g-1", res.Operation.FencingToken, OutcomeSucceeded, "R-1")
		if r := e.getRun(t, "guarded"); settles() != 1 || r.Open != 0 {
			t.Fatalf("a guarded operation: %d settles, run %+v; want 1, nothing open", settles(), r)
		}
		// Created before its run started: admitted as a step when retried
		// in the run, but not held open by it.
		early, err := e.step(t, "late", "early-1", "payments.refund", map[string]any{"amount": 1.0})
		if err != nil {
			t.Fatal(err)
		}
		e.startRun(t, "late", RunLimits{})
		if _, err := e.step(t, "late", "early-1", "payments.refund", map[string]any{"amount": 1.0}); err != nil {
			t.Fatal(err)
		}
		if r := e.getRun(t, "late"); r.Steps != 1 || r.Open != 0 {
			t.Fatalf("a run's retry of an operation created before it: %+v, want 1 step, nothing open", r)
		}
		e.settle(t, "early-1", early.Operation.FencingToken, OutcomeSucceeded, "R-1")
	})
}

// TestRunsOnCluster: on Redis Cluster, with autopipelining, two ledgers (two
// ledgerd instances) take concurrent steps of runs one of them started, and
// of run ids no run governs: each started run admits exactly its max_steps
// and refuses the rest, whichever ledger asks (the other learns of the run
// by its EXISTS), and the ungoverned steps all pass, uncounted.
func TestRunsOnCluster(t *testing.T) {
	cl := redistest.SharedCluster(t)
	pol, err := ParsePolicies([]byte(ledgertest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	var ls [2]*Ledger
	for i := range ls {
		rdb := cl.Client(t)
		h := autopipe.Enable(rdb, autopipe.Options{})
		t.Cleanup(h.Close)
		if ls[i], err = New(rdb, Options{Policies: pol}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	who := Principal{Tenant: "cluster-runs-" + randomHex(4), ID: "a"}
	const runs, maxSteps, tries = 6, 4, 7
	for r := range runs {
		if _, err := ls[0].StartRun(ctx, who, fmt.Sprintf("run-%d", r), RunLimits{MaxSteps: maxSteps}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	admitted, refused := map[string]int{}, map[string]int{}
	var wg sync.WaitGroup
	for r := range runs {
		for i := range tries {
			for _, run := range []string{fmt.Sprintf("run-%d", r), fmt.Sprintf("free-%d", r)} {
				wg.Go(func() {
					id := fmt.Sprintf("%s-op-%d", run, i)
					res, err := ls[i%2].Reserve(ctx, who, ReserveRequest{OperationID: id, Tool: "payments.refund", PermitID: "p", Holder: "h", RunID: run})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil && res.Decision == DecisionExecute && res.Operation.RunID == run:
						admitted[run]++
					case KindOf(err) == KindRunEnded:
						refused[run]++
					default:
						t.Errorf("Reserve %s: %+v, %v", id, res, err)
					}
				})
			}
		}
	}
	wg.Wait()
	for r := range runs {
		run, free := fmt.Sprintf("run-%d", r), fmt.Sprintf("free-%d", r)
		if admitted[run] != maxSteps || refused[run] != tries-maxSteps || admitted[free] != tries || refused[free] != 0 {
			t.Errorf("%s: %d admitted, %d refused; %s: %d admitted, %d refused", run, admitted[run], refused[run], free, admitted[free], refused[free])
		}
		got, err := ls[1].GetRun(ctx, who, run)
		if err != nil || got.Steps != maxSteps || got.State != RunStateStepLimit {
			t.Errorf("GetRun(%s) = %+v, %v; want %d steps, STEP_LIMIT", run, got, err, maxSteps)
		}
		if _, err := ls[1].GetRun(ctx, who, free); KindOf(err) != KindNotFound {
			t.Errorf("GetRun(%s) = %v; want not found", free, err)
		}
	}
}

// TestStartedRuns: the set holds what was added until it is dropped, and
// when full it is emptied before the next run goes in, so it never holds
// more than maxStartedRuns.
func TestStartedRuns(t *testing.T) {
	var s startedRuns
	if s.has("a") {
		t.Fatal("an empty set has a")
	}
	s.drop("a") // dropping from an empty set is no error
	for i := range maxStartedRuns {
		s.add(itoa(int64(i)))
	}
	if !s.has("0") || !s.has(itoa(maxStartedRuns-1)) || len(s.keys) != maxStartedRuns {
		t.Fatalf("a full set holds %d runs", len(s.keys))
	}
	s.drop("0")
	if s.has("0") || len(s.keys) != maxStartedRuns-1 {
		t.Fatalf("dropped 0: has %v, %d runs", s.has("0"), len(s.keys))
	}
	s.add("0")
	s.add("next")
	if s.has("0") || !s.has("next") || len(s.keys) != 1 {
		t.Fatalf("past full: has 0 %v, next %v, %d runs; want next alone", s.has("0"), s.has("next"), len(s.keys))
	}
}
