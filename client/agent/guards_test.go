package agent_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
	"github.com/opledger/ledger/internal/redistest"
)

// S14: a model stuck in a loop (the same tool, the same arguments, the same
// call id, forever) ends with "repetition", and the ledger applied the
// mutating tool's effect once: the second call replayed, the third was not
// run.
func TestS14RepetitionLoopingModel(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb)
		dest := newDestination()
		var modelCalls atomic.Int32
		loop := agent.ModelFunc(func(ctx context.Context, _ []agent.Message) (agent.Turn, error) {
			modelCalls.Add(1)
			return agent.Turn{Calls: []agent.ToolCall{{ID: "call-1", Name: "book", Args: map[string]any{"slot": "09:30", "patient": "p-1"}}}}, nil
		})
		r := mustNew(t, agent.Config{Client: env.client, Model: loop, Tools: []agent.Tool{bookTool(dest)}, MaxSteps: 50})
		runID := newRunID(t)
		out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("book me in")})

		if out.Status != agent.StatusRepetition || out.Err != nil {
			t.Fatalf("status = %q (%s, %v), want repetition", out.Status, out.Reason, out.Err)
		}
		if got := dest.total(); got != 1 {
			t.Fatalf("the destination applied %d effects, want exactly 1", got)
		}
		if out.Steps != 3 || modelCalls.Load() != 3 {
			t.Fatalf("steps = %d, model calls = %d; want 3 (the third identical call ends the run)", out.Steps, modelCalls.Load())
		}
		res := results(out.Transcript)
		if len(res) != 3 || res[0].Replayed || !res[1].Replayed || res[0].ResourceID != res[1].ResourceID ||
			res[2].Error == "" || res[2].ResourceID != "" {
			t.Fatalf("results = %+v; want the effect, its replay, and the third call refused", res)
		}

		// Resumed with a user's message, the run goes on to the model: the
		// refused call is not met again.
		answer := agent.ModelFunc(func(ctx context.Context, _ []agent.Message) (agent.Turn, error) {
			return agent.Turn{Text: "booked once, at 09:30"}, nil
		})
		resumed := mustNew(t, agent.Config{Client: env.client, Model: answer, Tools: []agent.Tool{bookTool(dest)}})
		again := resumed.Run(context.Background(), agent.Input{RunID: runID, Transcript: append(out.Transcript, user("stop booking")...)})
		if again.Status != agent.StatusDone || again.Answer != "booked once, at 09:30" {
			t.Fatalf("resumed: status = %q (%s, %v), want done with the model's answer", again.Status, again.Reason, again.Err)
		}
		if got := dest.total(); got != 1 {
			t.Fatalf("after the resume the destination applied %d effects, want exactly 1", got)
		}
	})
}

// The repetition guard compares canonical arguments (1 and 1.0 are the same
// number) whatever the call ids. Fresh call ids are new intents for the
// ledger, so RepeatLimit-1 of them run before the guard stops the loop.
func TestS14RepetitionCanonicalArgsFreshCallIDs(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb)
		dest := newDestination()
		loop := agent.ModelFunc(func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
			step := turns(transcript) + 1
			var amount any = 1 // int on odd steps, float64 on even ones: the same JSON number
			if step%2 == 0 {
				amount = 1.0
			}
			return agent.Turn{Calls: []agent.ToolCall{{ID: fmt.Sprintf("call-%d", step), Name: "book",
				Args: map[string]any{"n": amount, "nested": map[string]any{"b": true, "a": []any{"x", 2.5}}}}}}, nil
		})
		r := mustNew(t, agent.Config{Client: env.client, Model: loop, Tools: []agent.Tool{bookTool(dest)}, RepeatLimit: 4})
		out := r.Run(context.Background(), agent.Input{RunID: newRunID(t), Transcript: user("book")})
		if out.Status != agent.StatusRepetition {
			t.Fatalf("status = %q (%s), want repetition", out.Status, out.Reason)
		}
		if got := dest.total(); got != 3 {
			t.Fatalf("the destination applied %d effects, want RepeatLimit-1 = 3 (three call ids)", got)
		}
		if out.Steps != 4 {
			t.Fatalf("steps = %d, want 4", out.Steps)
		}
	})
}

// S14: a model that never finishes (new arguments every step) ends with
// "step_limit" after MaxSteps turns; each distinct call ran once.
func TestS14StepLimit(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb)
		dest := newDestination()
		var searches atomic.Int32
		search := agent.Tool{Name: "search", Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			searches.Add(1)
			return client.Result{Data: map[string]any{"hits": 0.0}}, nil
		}}
		never := agent.ModelFunc(func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
			step := turns(transcript) + 1
			return agent.Turn{Calls: []agent.ToolCall{
				{ID: fmt.Sprintf("s-%d", step), Name: "search", Args: map[string]any{"page": step}},
				{ID: fmt.Sprintf("b-%d", step), Name: "book", Args: map[string]any{"slot": step}},
			}}, nil
		})
		r := mustNew(t, agent.Config{Client: env.client, Model: never, Tools: []agent.Tool{search, bookTool(dest)}, MaxSteps: 4})
		out := r.Run(context.Background(), agent.Input{RunID: newRunID(t), Transcript: user("find a slot")})
		if out.Status != agent.StatusStepLimit || out.Err != nil {
			t.Fatalf("status = %q (%s, %v), want step_limit", out.Status, out.Reason, out.Err)
		}
		if out.Steps != 4 || searches.Load() != 4 || dest.total() != 4 {
			t.Fatalf("steps %d, searches %d, effects %d; want 4 each", out.Steps, searches.Load(), dest.total())
		}
	})
}

// S14 through the ledger's run guard: two Runners of one run (two workers)
// share the ledger's count of its mutating calls. A step cap of 3 lets
// three bookings through in all, the refused call is not run, and each
// worker's run ends with step_limit; a repetition limit ends a loop that
// mints new call ids for the same booking with repetition.
func TestS14RunGuardInTheLedger(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb)
		dest := newDestination()
		run := newRunID(t)
		booking := func(prefix string) agent.ModelFunc {
			return func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
				step := turns(transcript) + 1
				return agent.Turn{Calls: []agent.ToolCall{{ID: fmt.Sprintf("%s-%d", prefix, step), Name: "book",
					Args: map[string]any{"slot": prefix + fmt.Sprint(step)}}}}, nil
			}
		}
		limits := &client.RunLimits{MaxSteps: 3}
		first := mustNew(t, agent.Config{Client: env.client, Model: booking("a"), Tools: []agent.Tool{bookTool(dest)}, MaxSteps: 2, RunLimits: limits})
		if out := first.Run(context.Background(), agent.Input{RunID: run, Transcript: user("book")}); out.Status != agent.StatusStepLimit || out.Err != nil {
			t.Fatalf("the first worker: %q (%s, %v), want the Runner's step_limit", out.Status, out.Reason, out.Err)
		}
		second := mustNew(t, agent.Config{Client: env.client, Model: booking("b"), Tools: []agent.Tool{bookTool(dest)}, MaxSteps: 10, RunLimits: limits})
		out := second.Run(context.Background(), agent.Input{RunID: run, Transcript: user("book")})
		if rr, ok := client.RunOf(out.Err); out.Status != agent.StatusStepLimit || !ok || rr.State != client.RunStepLimit {
			t.Fatalf("the second worker: %q (%s, %v), want the ledger's step_limit", out.Status, out.Reason, out.Err)
		}
		if got := dest.total(); got != 3 {
			t.Fatalf("the destination applied %d effects, want 3 (the run's cap)", got)
		}

		loop := agent.ModelFunc(func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
			return agent.Turn{Calls: []agent.ToolCall{{ID: fmt.Sprintf("c-%d", turns(transcript)+1), Name: "book",
				Args: map[string]any{"slot": "09:30"}}}}, nil
		})
		r := mustNew(t, agent.Config{Client: env.client, Model: loop, Tools: []agent.Tool{bookTool(dest)}, MaxSteps: 10, RepeatLimit: 10,
			RunLimits: &client.RunLimits{MaxRepeats: 2}})
		out = r.Run(context.Background(), agent.Input{RunID: newRunID(t), Transcript: user("book 09:30")})
		if out.Status != agent.StatusRepetition || out.Steps != 3 {
			t.Fatalf("the loop: %q after %d steps (%s, %v), want repetition after 3", out.Status, out.Steps, out.Reason, out.Err)
		}
		if got := dest.total(); got != 5 {
			t.Fatalf("the destination applied %d effects, want 5 (3, then the loop's 2)", got)
		}
	})
}

// slowModel answers after d (honouring ctx), with new arguments every time.
func slowModel(d time.Duration) agent.ModelFunc {
	return func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return agent.Turn{}, ctx.Err()
		}
		step := turns(transcript) + 1
		return agent.Turn{Calls: []agent.ToolCall{{ID: fmt.Sprintf("c-%d", step), Name: "noop", Args: map[string]any{"i": step}}}}, nil
	}
}

var noop = agent.Tool{Name: "noop", Func: func(ctx context.Context, c agent.Call) (client.Result, error) { return client.Result{}, nil }}

// stuckModel ignores its context and never answers until the test ends.
func stuckModel(t *testing.T) agent.ModelFunc {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	return func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
		<-release
		return agent.Turn{Text: "too late"}, nil
	}
}

// S14: a slow model ends with "deadline".
func TestS14Deadline(t *testing.T) {
	t.Run("slow model", func(t *testing.T) {
		// The deadline leaves room for a first step on a busy machine.
		r := mustNew(t, agent.Config{Model: slowModel(20 * time.Millisecond), Tools: []agent.Tool{noop}, Deadline: room, MaxSteps: 1000})
		out := r.Run(context.Background(), agent.Input{RunID: "r1", Transcript: user("hi")})
		if out.Status != agent.StatusDeadline || out.Err != nil {
			t.Fatalf("status = %q (%s, %v), want deadline", out.Status, out.Reason, out.Err)
		}
		if out.Steps < 1 {
			t.Fatalf("steps = %d", out.Steps)
		}
	})
	t.Run("model ignoring its context", func(t *testing.T) {
		r := mustNew(t, agent.Config{Model: stuckModel(t), Deadline: 50 * time.Millisecond, ModelTimeout: time.Hour})
		out := r.Run(context.Background(), agent.Input{RunID: "r2", Transcript: user("hi")})
		if out.Status != agent.StatusDeadline {
			t.Fatalf("status = %q (%s, %v), want deadline", out.Status, out.Reason, out.Err)
		}
	})
	t.Run("caller's context deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		r := mustNew(t, agent.Config{Model: slowModel(20 * time.Millisecond), Tools: []agent.Tool{noop}, MaxSteps: 1000})
		out := r.Run(ctx, agent.Input{RunID: "r3", Transcript: user("hi")})
		if out.Status != agent.StatusDeadline {
			t.Fatalf("status = %q (%s, %v), want deadline", out.Status, out.Reason, out.Err)
		}
	})
}

// A model call longer than ModelTimeout ends the run with "error", even when
// the model ignores its context.
func TestModelTimeout(t *testing.T) {
	r := mustNew(t, agent.Config{Model: stuckModel(t), ModelTimeout: 30 * time.Millisecond})
	out := r.Run(context.Background(), agent.Input{RunID: "r", Transcript: user("hi")})
	if out.Status != agent.StatusError || !errors.Is(out.Err, agent.ErrModelTimeout) {
		t.Fatalf("status = %q, err = %v; want error, ErrModelTimeout", out.Status, out.Err)
	}
}

// A model that panics, or fails, ends the run with "error", without
// panicking the caller.
func TestModelPanicAndErrorEndRun(t *testing.T) {
	t.Run("panic", func(t *testing.T) {
		var calls atomic.Int32
		m := agent.ModelFunc(func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
			if calls.Add(1) == 2 {
				panic("model exploded")
			}
			return agent.Turn{Calls: []agent.ToolCall{{ID: "c1", Name: "noop"}}}, nil
		})
		r := mustNew(t, agent.Config{Model: m, Tools: []agent.Tool{noop}})
		out := r.Run(context.Background(), agent.Input{RunID: "r", Transcript: user("hi")})
		var p *agent.PanicError
		if out.Status != agent.StatusError || !errors.As(out.Err, &p) || p.Where != "model" || p.Value != "model exploded" {
			t.Fatalf("status = %q, err = %v; want error with the model's panic", out.Status, out.Err)
		}
		if out.Steps != 2 || len(results(out.Transcript)) != 1 {
			t.Fatalf("steps = %d, transcript = %+v", out.Steps, out.Transcript)
		}
	})
	t.Run("error", func(t *testing.T) {
		boom := errors.New("rate limited by the model API")
		m := agent.ModelFunc(func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) { return agent.Turn{}, boom })
		out := mustNew(t, agent.Config{Model: m}).Run(context.Background(), agent.Input{RunID: "r", Transcript: user("hi")})
		if out.Status != agent.StatusError || !errors.Is(out.Err, boom) {
			t.Fatalf("status = %q, err = %v", out.Status, out.Err)
		}
	})
}

// A canceled context ends the run with "error"; a missing run id, or one
// with ':', too.
func TestCanceledAndBadInput(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := mustNew(t, agent.Config{Model: slowModel(time.Millisecond)}).Run(ctx, agent.Input{RunID: "r"})
	if out.Status != agent.StatusError || !errors.Is(out.Err, context.Canceled) {
		t.Fatalf("canceled: status = %q, err = %v", out.Status, out.Err)
	}
	out = mustNew(t, agent.Config{Model: slowModel(time.Millisecond)}).Run(context.Background(), agent.Input{})
	if out.Status != agent.StatusError || out.Err == nil {
		t.Fatalf("no run id: status = %q, err = %v", out.Status, out.Err)
	}
	// Run "a:b" with call "c" would share operation id "a:b:c" with run "a"
	// and call "b:c": a run id with ':' is refused before the model is asked.
	asked := false
	m := agent.ModelFunc(func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
		asked = true
		return agent.Turn{Text: "done"}, nil
	})
	out = mustNew(t, agent.Config{Model: m}).Run(context.Background(), agent.Input{RunID: "a:b", Transcript: user("hi")})
	if out.Status != agent.StatusError || out.Err == nil || asked {
		t.Fatalf("run id with ':': status = %q, err = %v, model asked: %v", out.Status, out.Err, asked)
	}
}

// New refuses configurations that cannot run safely.
func TestNewValidates(t *testing.T) {
	m := slowModel(time.Millisecond)
	c, err := client.Dial("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, cfg := range map[string]agent.Config{
		"no model":                  {},
		"unnamed tool":              {Model: m, Tools: []agent.Tool{{Func: noop.Func}}},
		"tool without func":         {Model: m, Tools: []agent.Tool{{Name: "x"}}},
		"duplicate tool":            {Model: m, Tools: []agent.Tool{noop, noop}},
		"mutating without client":   {Model: m, Tools: []agent.Tool{{Name: "pay", Mutating: true, Func: noop.Func}}},
		"repeat limit 1":            {Model: m, RepeatLimit: 1},
		"negative steps":            {Model: m, MaxSteps: -1},
		"run limits without client": {Model: m, RunLimits: &client.RunLimits{MaxSteps: 3}},
	} {
		if _, err := agent.New(cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	if _, err := agent.New(agent.Config{Client: c, Model: m, Tools: []agent.Tool{{Name: "pay", Mutating: true, Func: noop.Func}}}); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}

// A transcript that already ends with the final answer is done without
// asking the model again.
func TestResumeFinishedRun(t *testing.T) {
	m := agent.ModelFunc(func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
		t.Error("the model was asked again")
		return agent.Turn{}, nil
	})
	tr := append(user("hi"), agent.Message{Role: agent.RoleAssistant, Text: "hello"})
	out := mustNew(t, agent.Config{Model: m}).Run(context.Background(), agent.Input{RunID: "r", Transcript: tr})
	if out.Status != agent.StatusDone || out.Answer != "hello" || out.Steps != 1 {
		t.Fatalf("outcome = %+v", out)
	}
}
