package agent_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
	"github.com/opledger/ledger/internal/redistest"
)

// patience bounds how long a test waits for a run that must end at its
// deadline: far beyond the deadlines here, far below the waits the runs
// face (a claim held until the test releases it, an hour of backoff).
const patience = 30 * time.Second

// room is the deadline of a run that must pass while a call waits (or while
// a tool runs): far more than the run needs to get there (a model turn, a
// Reserve, an attempt) on a busy machine, so the deadline does not pass
// before, where the run would end for another reason.
const room = 2 * time.Second

// hourBackoff makes every backoff of a client an hour long.
var hourBackoff = client.WithBackoff(client.Backoff{Base: time.Hour, Max: time.Hour})

// runAsync runs r on its own goroutine and returns the outcome's channel.
func runAsync(r *agent.Runner, in agent.Input) <-chan agent.Outcome {
	done := make(chan agent.Outcome, 1)
	go func() { done <- r.Run(context.Background(), in) }()
	return done
}

// ended waits for a run's outcome, for at most patience.
func ended(t *testing.T, done <-chan agent.Outcome) agent.Outcome {
	t.Helper()
	select {
	case out := <-done:
		return out
	case <-time.After(patience):
		t.Fatalf("the run still going after %s: its deadline did not end it", patience)
		return agent.Outcome{}
	}
}

// endedWaiting checks that a run ended with "deadline" while Do waited for
// want, with the call pending.
func endedWaiting(t *testing.T, out agent.Outcome, want client.Wait) {
	t.Helper()
	var wd *client.WaitDeadlineError
	if out.Status != agent.StatusDeadline || !errors.As(out.Err, &wd) || !errors.Is(out.Err, client.ErrWaitDeadline) {
		t.Fatalf("status %q (%s), err %v; want deadline with a *client.WaitDeadlineError", out.Status, out.Reason, out.Err)
	}
	if wd.Waiting != want {
		t.Fatalf("Do stopped waiting for %q, want %q", wd.Waiting, want)
	}
	if res := results(out.Transcript); len(res) != 0 {
		t.Fatalf("results %+v; want none: the call stays pending", res)
	}
}

// S14: a run whose deadline passes while its call waits on another
// holder's claim (a second worker of the same run, whose tool is still
// running) ends with "deadline" before that claim ends; the call stays
// pending, and the resumed run replays the holder's result: one effect.
func TestS14DeadlineWhileWaitingOnAnotherHolder(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb, hourBackoff) // every wait on the claim is an hour long
		dest := newDestination()
		release, started := make(chan struct{}), make(chan struct{})
		var once sync.Once
		free := func() { once.Do(func() { close(release) }) }
		t.Cleanup(free)
		held := bookTool(dest)
		inner := held.Func
		held.Func = func(ctx context.Context, c agent.Call) (client.Result, error) {
			close(started)
			<-release // the claim is held until the test says so
			return inner(ctx, c)
		}
		call := agent.ToolCall{ID: "call-1", Name: "book", Args: map[string]any{"slot": "10:00"}}
		runID := newRunID(t)
		in := agent.Input{RunID: runID, Transcript: user("book")}
		holder := runAsync(mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{held}}), in)
		<-started

		waiter := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{bookTool(dest)}, Deadline: room})
		out := ended(t, runAsync(waiter, in))
		select {
		case o := <-holder:
			t.Fatalf("the holder's run ended first (%q): the deadline was not what ended the wait", o.Status)
		default:
		}
		endedWaiting(t, out, client.WaitInProgress)

		free()
		if o := <-holder; o.Status != agent.StatusDone {
			t.Fatalf("holder: status %q (%v)", o.Status, o.Err)
		}
		resumed := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{bookTool(dest)}})
		o := resumed.Run(context.Background(), agent.Input{RunID: runID, Transcript: out.Transcript})
		if res := results(o.Transcript); o.Status != agent.StatusDone || len(res) != 1 || !res[0].Replayed {
			t.Fatalf("resumed: status %q (%v), results %+v; want done with the replayed result", o.Status, o.Err, res)
		}
		if got := dest.total(); got != 1 {
			t.Fatalf("the destination applied %d effects, want exactly 1", got)
		}
	})
}

// S14: a mutating tool already running when the run's deadline passes is
// not cut: its context stays live, its effect is applied once and recorded,
// and the run then ends with "deadline" at the next step's guard.
func TestS14DeadlineDoesNotCutARunningTool(t *testing.T) {
	env := startLedger(t, redistest.Shared(t).Client(t))
	dest := newDestination()
	var cut atomic.Bool
	long := bookTool(dest)
	inner := long.Func
	long.Func = func(ctx context.Context, c agent.Call) (client.Result, error) {
		wd, ok := client.WaitDeadline(ctx) // the run's deadline
		if !ok {
			return client.Result{}, client.MarkFinal("test", errors.New("no run deadline in the tool's context"))
		}
		// Still running well after the deadline passed; a context cut by
		// it ends first.
		select {
		case <-ctx.Done():
			cut.Store(true)
			return client.Result{}, client.MarkFinal("test", ctx.Err()) // nothing applied
		case <-time.After(time.Until(wd) + 100*time.Millisecond):
		}
		return inner(ctx, c)
	}
	call := agent.ToolCall{ID: "call-1", Name: "book", Args: map[string]any{"slot": "11:00"}}
	runID := newRunID(t)
	r := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{long}, Deadline: room})
	out := ended(t, runAsync(r, agent.Input{RunID: runID, Transcript: user("book")}))
	if out.Status != agent.StatusDeadline || out.Err != nil {
		t.Fatalf("status %q (%s, %v); want deadline at the next step", out.Status, out.Reason, out.Err)
	}
	res := results(out.Transcript)
	if cut.Load() || len(res) != 1 || res[0].Error != "" || res[0].Replayed || res[0].ResourceID == "" {
		t.Fatalf("tool cut: %v; results %+v; want the tool's own result", cut.Load(), res)
	}
	if got := dest.total(); got != 1 {
		t.Fatalf("the destination applied %d effects, want exactly 1", got)
	}
	o, err := env.client.Lookup(context.Background(), runID+":call-1")
	if err != nil || o.State != client.StateSucceeded || o.Result == nil || o.Result.ResourceID != res[0].ResourceID {
		t.Fatalf("record %+v, %v; want SUCCEEDED with the tool's result", o, err)
	}
}

// S14: a run whose deadline passes in the backoff after a refused attempt
// ends with "deadline"; the call stays pending (its operation PENDING), and
// the resumed run applies the effect once.
func TestS14DeadlineInTheBackoff(t *testing.T) {
	env := startLedger(t, redistest.Shared(t).Client(t), hourBackoff)
	dest := newDestination()
	var refused atomic.Bool
	flaky := bookTool(dest)
	inner := flaky.Func
	flaky.Func = func(ctx context.Context, c agent.Call) (client.Result, error) {
		if refused.CompareAndSwap(false, true) {
			return client.Result{}, client.MarkRetryable(errors.New("503 from the clinic's rate limiter"))
		}
		return inner(ctx, c)
	}
	call := agent.ToolCall{ID: "call-1", Name: "book", Args: map[string]any{"slot": "12:00"}}
	runID := newRunID(t)
	r := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{flaky}, Deadline: room})
	out := ended(t, runAsync(r, agent.Input{RunID: runID, Transcript: user("book")}))
	endedWaiting(t, out, client.WaitBackoff)
	if dest.total() != 0 || !refused.Load() {
		t.Fatalf("effects %d, refused %v; want the one refused attempt", dest.total(), refused.Load())
	}

	c := dial(t, env.stack.Addr) // fast backoff
	resumed := mustNew(t, agent.Config{Client: c, Model: callOnceThenAnswer(call), Tools: []agent.Tool{flaky}})
	o := resumed.Run(context.Background(), agent.Input{RunID: runID, Transcript: out.Transcript})
	if res := results(o.Transcript); o.Status != agent.StatusDone || len(res) != 1 || res[0].Replayed || dest.total() != 1 {
		t.Fatalf("resumed: status %q (%v), results %+v, effects %d; want done, one effect", o.Status, o.Err, res, dest.total())
	}
}

// S14: the deadline passes while the first of a turn's two read calls runs.
// That call finishes and is recorded, but the second one is not started
// after the deadline: the run ends with "deadline" and the call stays
// pending; the resumed run runs it.
func TestS14DeadlineBetweenCallsOfOneTurn(t *testing.T) {
	const deadline = room
	var slowRuns, lookups atomic.Int32
	tools := []agent.Tool{
		{Name: "slow", Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			slowRuns.Add(1)
			// The run started before this call did: its deadline passes
			// in the meantime.
			time.Sleep(deadline + time.Millisecond)
			return client.Result{}, nil
		}},
		{Name: "lookup", Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			lookups.Add(1)
			return client.Result{}, nil
		}},
	}
	model := agent.ModelFunc(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
		if turns(tr) == 0 {
			return agent.Turn{Calls: []agent.ToolCall{{ID: "c1", Name: "slow"}, {ID: "c2", Name: "lookup"}}}, nil
		}
		return agent.Turn{Text: "done"}, nil
	})
	r := mustNew(t, agent.Config{Model: model, Tools: tools, Deadline: deadline})
	out := r.Run(context.Background(), agent.Input{RunID: "r", Transcript: user("go")})
	if out.Status != agent.StatusDeadline || out.Err != nil {
		t.Fatalf("status %q (%s, %v); want deadline", out.Status, out.Reason, out.Err)
	}
	if res := results(out.Transcript); len(res) != 1 || res[0].CallID != "c1" || lookups.Load() != 0 {
		t.Fatalf("results %+v, lookups %d; want c1's result only, c2 not started", res, lookups.Load())
	}
	out = mustNew(t, agent.Config{Model: model, Tools: tools}).Run(context.Background(), agent.Input{RunID: "r", Transcript: out.Transcript})
	if res := results(out.Transcript); out.Status != agent.StatusDone || len(res) != 2 || res[1].CallID != "c2" || lookups.Load() != 1 || slowRuns.Load() != 1 {
		t.Fatalf("resumed: status %q, results %+v, lookups %d, slow runs %d", out.Status, res, lookups.Load(), slowRuns.Load())
	}
}
