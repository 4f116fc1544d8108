package agent_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
)

// Tool errors reach the model as data and the run goes on: a read tool's
// error, a read tool's panic, a mutating tool's final failure, a mutating
// tool that stays refused (retryable) past its retries, an unknown tool, a
// call without id and arguments with no canonical form.
func TestToolErrorsReachModel(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb)
		var refusals atomic.Int32
		tools := []agent.Tool{
			{Name: "lookup", Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
				return client.Result{}, errors.New("no such order")
			}},
			{Name: "explode", Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
				panic("read tool bug")
			}},
			{Name: "charge", Mutating: true, Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
				return client.Result{}, client.MarkFinal("card_declined", errors.New("the card was declined"))
			}},
			{Name: "notify", Mutating: true, Policy: client.ToolPolicy{Timeout: time.Second, MaxRetries: 1},
				Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
					refusals.Add(1)
					return client.Result{}, client.MarkRetryable(errors.New("mail server busy"))
				}},
		}
		var seen []agent.ToolResult
		m := agent.ModelFunc(func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
			if turns(transcript) == 0 {
				return agent.Turn{Calls: []agent.ToolCall{
					{ID: "c1", Name: "lookup", Args: map[string]any{"order": "o-1"}},
					{ID: "c2", Name: "explode"},
					{ID: "c3", Name: "charge", Args: map[string]any{"amount": 10}},
					{ID: "c4", Name: "notify", Args: map[string]any{"to": "u-1"}},
					{ID: "c5", Name: "teleport"},
					{ID: "", Name: "lookup", Args: map[string]any{"order": "o-2"}},
					{ID: "c7", Name: "lookup", Args: map[string]any{"bad": make(chan int)}},
				}}, nil
			}
			seen = results(transcript)
			return agent.Turn{Text: "sorry, nothing worked"}, nil
		})
		r := mustNew(t, agent.Config{Client: env.client, Model: m, Tools: tools})
		out := r.Run(context.Background(), agent.Input{RunID: newRunID(t), Transcript: user("help")})
		if out.Status != agent.StatusDone || out.Answer != "sorry, nothing worked" {
			t.Fatalf("status = %q (%s, %v)", out.Status, out.Reason, out.Err)
		}
		want := []string{"no such order", "tool panicked: read tool bug", "card_declined", "mail server busy",
			`unknown tool "teleport"`, "no call id", "invalid arguments"}
		if len(seen) != len(want) {
			t.Fatalf("the model saw %d results, want %d: %+v", len(seen), len(want), seen)
		}
		for i, w := range want {
			if !strings.Contains(seen[i].Error, w) {
				t.Errorf("result %d: error %q, want it to mention %q", i, seen[i].Error, w)
			}
		}
		if refusals.Load() != 2 {
			t.Errorf("notify ran %d times, want 2 (MaxRetries 1)", refusals.Load())
		}
	})
}

// checkpoints is a fake durable store of transcripts that can crash.
type checkpoints struct {
	mu    sync.Mutex
	saved []agent.Message
	crash func(transcript []agent.Message) bool
}

var errCrash = errors.New("simulated crash: the worker died before saving its state")

func (s *checkpoints) save(ctx context.Context, runID string, transcript []agent.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.crash != nil && s.crash(transcript) {
		return errCrash
	}
	s.saved = transcript
	return nil
}

func (s *checkpoints) load() []agent.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saved
}

// A mutating call re-sent after a crash (same run id, same call id) is
// replayed by the ledger: the effect is not applied again. Three ways to
// resume: from the saved transcript (the call is pending), from scratch with
// a model that emits the same call id, and two workers at once.
func TestCrashAfterResponseReplays(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb)
		dest := newDestination()
		runID := newRunID(t)
		call := agent.ToolCall{ID: "call-1", Name: "book", Args: map[string]any{"slot": "09:30", "patient": "p-7"}}
		store := &checkpoints{crash: func(tr []agent.Message) bool { return tr[len(tr)-1].Role == agent.RoleTool }}
		r := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{bookTool(dest)}, Checkpoint: store.save})

		out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("book")})
		if out.Status != agent.StatusError || !errors.Is(out.Err, errCrash) {
			t.Fatalf("first run: status %q, err %v; want the simulated crash", out.Status, out.Err)
		}
		first := lastResult(out.Transcript)
		if dest.total() != 1 || first == nil || first.ResourceID == "" {
			t.Fatalf("first run: %d effects, result %+v", dest.total(), first)
		}
		saved := store.load()
		if len(saved) != 2 || len(saved[1].Calls) != 1 {
			t.Fatalf("saved transcript = %+v; want the request and the pending call", saved)
		}

		// A new process resumes from the saved transcript.
		store.crash = nil
		r2 := mustNew(t, agent.Config{Client: dial(t, env.stack.Addr), Model: callOnceThenAnswer(call), Tools: []agent.Tool{bookTool(dest)}, Checkpoint: store.save})
		out = r2.Run(context.Background(), agent.Input{RunID: runID, Transcript: saved})
		res := results(out.Transcript)
		if out.Status != agent.StatusDone || len(res) != 1 || !res[0].Replayed || res[0].ResourceID != first.ResourceID {
			t.Fatalf("resumed run: status %q (%v), results %+v; want done with the replayed %s", out.Status, out.Err, res, first.ResourceID)
		}
		if out.Answer != "done: "+first.ResourceID || out.Steps != 2 {
			t.Fatalf("resumed run: answer %q, steps %d", out.Answer, out.Steps)
		}

		// Starting over with the same run id, the model emits the same call id.
		out = r2.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("book")})
		if r := lastResult(out.Transcript[:len(out.Transcript)-1]); out.Status != agent.StatusDone || r == nil || !r.Replayed || r.ResourceID != first.ResourceID {
			t.Fatalf("rerun: status %q, result %+v", out.Status, r)
		}

		// Two workers resume the same saved state at once.
		var wg sync.WaitGroup
		outs := make([]agent.Outcome, 2)
		for i := range outs {
			wg.Go(func() { outs[i] = r2.Run(context.Background(), agent.Input{RunID: runID, Transcript: saved}) })
		}
		wg.Wait()
		for i, o := range outs {
			if o.Status != agent.StatusDone || o.Answer != "done: "+first.ResourceID {
				t.Fatalf("worker %d: status %q (%v), answer %q", i, o.Status, o.Err, o.Answer)
			}
		}
		if got := dest.total(); got != 1 {
			t.Fatalf("the destination applied %d effects, want exactly 1", got)
		}
	})
}

// Two workers running the same call for the first time at once: the ledger
// lets one execute; the other waits and replays.
func TestConcurrentRunsSameCall(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		// waiting is closed once the ledger has answered a worker
		// IN_PROGRESS: that worker is then waiting for the other.
		see, waiting := ledgertest.SeeInProgress()
		seeWait := client.WithDialOptions(grpc.WithChainUnaryInterceptor(see))
		env := startLedger(t, rdb, seeWait)
		dest := newDestination()
		gate := make(chan struct{})
		slow := bookTool(dest)
		inner := slow.Func
		slow.Func = func(ctx context.Context, c agent.Call) (client.Result, error) {
			<-gate // hold the claim until the other worker waits for it
			return inner(ctx, c)
		}
		call := agent.ToolCall{ID: "call-1", Name: "book", Args: map[string]any{"slot": "10:00"}}
		r := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{slow}})
		runID := newRunID(t)
		var wg sync.WaitGroup
		outs := make([]agent.Outcome, 2)
		for i := range outs {
			wg.Go(func() { outs[i] = r.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("book")}) })
		}
		<-waiting
		close(gate)
		wg.Wait()
		if outs[0].Status != agent.StatusDone || outs[1].Status != agent.StatusDone || outs[0].Answer != outs[1].Answer {
			t.Fatalf("outcomes: %q %q / %q %q", outs[0].Status, outs[0].Answer, outs[1].Status, outs[1].Answer)
		}
		if got := dest.total(); got != 1 {
			t.Fatalf("the destination applied %d effects, want exactly 1", got)
		}
	})
}

// A call id re-sent with rewritten arguments is refused (ErrKeyReused): the
// run ends with "error", the effect is not applied again, and the call stays
// pending.
func TestKeyReusedEndsRun(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb)
		dest := newDestination()
		runID := newRunID(t)
		call := agent.ToolCall{ID: "call-1", Name: "book", Args: map[string]any{"slot": "09:30"}}
		r := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{bookTool(dest)}})
		if out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("book")}); out.Status != agent.StatusDone {
			t.Fatalf("first run: %q %v", out.Status, out.Err)
		}
		rewritten := append(user("book"), agent.Message{Role: agent.RoleAssistant, Calls: []agent.ToolCall{
			{ID: "call-1", Name: "book", Args: map[string]any{"slot": "17:00"}},
		}})
		out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: rewritten})
		if out.Status != agent.StatusError || !errors.Is(out.Err, client.ErrKeyReused) {
			t.Fatalf("status %q, err %v; want error, ErrKeyReused", out.Status, out.Err)
		}
		if len(results(out.Transcript)) != 0 || dest.total() != 1 {
			t.Fatalf("results %+v, effects %d", results(out.Transcript), dest.total())
		}
	})
}

// When the ledger cannot be reached the tool is not run and the run ends
// with "error" (ErrUnavailable); the call stays pending.
func TestLedgerUnavailableEndsRun(t *testing.T) {
	rdb := redistest.Shared(t).Client(t)
	env := startLedger(t, rdb, client.WithLedgerRetries(1), client.WithCallTimeout(time.Second))
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	env.stack.Service.Shutdown(sctx)
	cancel()
	dest := newDestination()
	call := agent.ToolCall{ID: "call-1", Name: "book", Args: map[string]any{"slot": "09:30"}}
	r := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{bookTool(dest)}})
	out := r.Run(context.Background(), agent.Input{RunID: newRunID(t), Transcript: user("book")})
	if out.Status != agent.StatusError || !errors.Is(out.Err, client.ErrUnavailable) {
		t.Fatalf("status %q, err %v; want error, ErrUnavailable", out.Status, out.Err)
	}
	if dest.total() != 0 || len(results(out.Transcript)) != 0 {
		t.Fatalf("effects %d, results %+v; want none", dest.total(), results(out.Transcript))
	}
}

// A mutating tool that panics ends the run with "error" and leaves the
// operation UNKNOWN with the call pending; the resumed run reconciles it
// (the reconciler finds the effect) instead of applying it again.
func TestMutatingToolPanicEndsRunAndReconciles(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb)
		dest := newDestination()
		var panics atomic.Bool
		panics.Store(true)
		tool := bookTool(dest)
		tool.Func = func(ctx context.Context, c agent.Call) (client.Result, error) {
			id := dest.apply(c.Attempt.OperationID)
			if panics.Load() {
				panic("bug after the write")
			}
			return client.Result{ResourceID: id}, nil
		}
		call := agent.ToolCall{ID: "call-1", Name: "book", Args: map[string]any{"slot": "11:00"}}
		r := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{tool}})
		runID := newRunID(t)
		out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("book")})
		var p *agent.PanicError
		if out.Status != agent.StatusError || !errors.As(out.Err, &p) || p.Where != "tool book" {
			t.Fatalf("status %q, err %v; want error with the tool's panic", out.Status, out.Err)
		}
		if len(results(out.Transcript)) != 0 {
			t.Fatalf("the panicked call got a result: %+v", results(out.Transcript))
		}
		op, err := env.client.Lookup(context.Background(), runID+":call-1")
		if err != nil || op.State != client.StateUnknown {
			t.Fatalf("operation = %+v, %v; want UNKNOWN", op, err)
		}

		panics.Store(false)
		out = r.Run(context.Background(), agent.Input{RunID: runID, Transcript: out.Transcript})
		res := results(out.Transcript)
		if out.Status != agent.StatusDone || len(res) != 1 || !res[0].Replayed || res[0].ResourceID != "res-1" {
			t.Fatalf("resumed: status %q (%v), results %+v", out.Status, out.Err, res)
		}
		if dest.total() != 1 {
			t.Fatalf("the destination applied %d effects, want 1", dest.total())
		}
	})
}

// A mutating tool's result data in Go types the wire format cannot carry as
// they are ([]string, map[string]string) is still recorded: the operation
// ends SUCCEEDED and the model gets the data.
func TestMutatingResultDataIsRecorded(t *testing.T) {
	env := startLedger(t, redistest.Shared(t).Client(t))
	tool := agent.Tool{Name: "tag", Mutating: true, Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
		return client.Result{ResourceID: "t-1", Data: map[string]any{"tags": []string{"a", "b"}, "labels": map[string]string{"k": "v"}}}, nil
	}}
	call := agent.ToolCall{ID: "call-1", Name: "tag", Args: map[string]any{"x": 1}}
	runID := newRunID(t)
	out := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{tool}}).
		Run(context.Background(), agent.Input{RunID: runID, Transcript: user("tag it")})
	res := results(out.Transcript)
	if out.Status != agent.StatusDone || len(res) != 1 || res[0].Error != "" {
		t.Fatalf("status %q (%v), results %+v", out.Status, out.Err, res)
	}
	if tags, _ := res[0].Data["tags"].([]any); len(tags) != 2 || tags[0] != "a" {
		t.Fatalf("data = %#v", res[0].Data)
	}
	op, err := env.client.Lookup(context.Background(), runID+":call-1")
	if err != nil || op.State != client.StateSucceeded || op.Result == nil || op.Result.ResourceID != "t-1" {
		t.Fatalf("operation = %+v, %v; want SUCCEEDED with the result", op, err)
	}
}

// Result data the wire would carry changed (an integer its doubles would
// round) is not recorded changed: a replay would hand the model another
// resource than the one the tool made. The effect is left to
// reconciliation, and the tool is not run again.
func TestMutatingResultDataIsNotRecordedChanged(t *testing.T) {
	env := startLedger(t, redistest.Shared(t).Client(t))
	var runs atomic.Int32
	tool := agent.Tool{Name: "tag", Mutating: true, Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
		runs.Add(1)
		return client.Result{ResourceID: "t-1", Data: map[string]any{"ids": []int64{1<<53 + 1}}}, nil
	}}
	call := agent.ToolCall{ID: "call-1", Name: "tag", Args: map[string]any{"x": 1}}
	runID := newRunID(t)
	for range 2 {
		mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{tool}}).
			Run(context.Background(), agent.Input{RunID: runID, Transcript: user("tag it")})
	}
	op, err := env.client.Lookup(context.Background(), runID+":call-1")
	if err != nil || op.State != client.StateUnknown || op.Result != nil {
		t.Fatalf("operation = %+v, %v; want UNKNOWN with no result recorded", op, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the tool ran %d times, want 1", n)
	}
}

// The ledger does not record how an ambiguous refund ended: it hangs, is
// unavailable, or answers that it no longer has the operation. The effect
// may exist, so the run stops with the call pending instead of handing the
// model an error it would answer with a new call id (a second refund).
func TestOutcomeNotRecordedEndsRun(t *testing.T) {
	for _, mode := range []string{"hung", "unavailable", "not-found"} {
		t.Run(mode, func(t *testing.T) {
			fault := client.WithDialOptions(grpc.WithChainUnaryInterceptor(ledgertest.Fault("MarkUnknown", mode)))
			env := startLedger(t, redistest.Shared(t).Client(t), fault,
				client.WithReportTimeout(200*time.Millisecond), client.WithCallTimeout(time.Minute))
			dest := newDestination()
			refund := agent.Tool{Name: "refund", Mutating: true,
				Policy: client.ToolPolicy{Timeout: 5 * time.Second, MaxRetries: 1, Effect: client.EffectIrreversible},
				Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
					dest.apply(c.Attempt.OperationID)
					return client.Result{}, errors.New("read tcp: i/o timeout") // applied, response lost
				}}
			calls := 0
			model := agent.ModelFunc(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
				if r := lastResult(tr); r != nil && r.Error == "" || calls >= 2 {
					return agent.Turn{Text: "done"}, nil
				}
				calls++ // a failed call is asked for again, under a new call id
				return agent.Turn{Calls: []agent.ToolCall{{ID: "call-" + strconv.Itoa(calls), Name: "refund", Args: map[string]any{"amount": 5}}}}, nil
			})
			r := mustNew(t, agent.Config{Client: env.client, Model: model, Tools: []agent.Tool{refund}})
			out := r.Run(context.Background(), agent.Input{RunID: newRunID(t), PermitID: "p", Transcript: user("refund 5")})
			if dest.total() != 1 {
				t.Fatalf("refund applied %d times (status %q, results %+v)", dest.total(), out.Status, results(out.Transcript))
			}
			if out.Status != agent.StatusError || len(results(out.Transcript)) != 0 {
				t.Fatalf("status %q, err %v, results %+v; want error with the call pending", out.Status, out.Err, results(out.Transcript))
			}
			if mode != "not-found" && !errors.Is(out.Err, client.ErrUnavailable) {
				t.Fatalf("err %v; want ErrUnavailable", out.Err)
			}
		})
	}
}

// An idempotent tool (its destination honours the idempotency key) whose
// first attempt applied the effect but lost the response, and whose retry
// was refused (connection refused): the retries are used up, but the first
// attempt was never proven not applied (the ledger reclaims an UNKNOWN
// idempotent operation without reconciling it). The run stops with the call
// pending instead of handing the model an error it would answer under a new
// call id, a new key the destination would apply again; the resumed run
// retries under the same key.
func TestExhaustedAfterUnsettledAttemptEndsRun(t *testing.T) {
	env := startLedger(t, redistest.Shared(t).Client(t))
	var (
		mu      sync.Mutex
		byKey   = map[string]string{} // idempotency key -> shipment
		applied int
		runs    atomic.Int32
	)
	ship := agent.Tool{Name: "ship", Mutating: true,
		Policy: client.ToolPolicy{Timeout: 5 * time.Second, MaxRetries: 1, Effect: client.EffectIdempotent},
		Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			n := runs.Add(1)
			if n == 2 {
				return client.Result{}, client.MarkRetryable(errors.New("dial tcp: connection refused"))
			}
			mu.Lock()
			id, ok := byKey[c.Attempt.IdempotencyKey]
			if !ok {
				applied++
				id = "ship-" + strconv.Itoa(applied)
				byKey[c.Attempt.IdempotencyKey] = id
			}
			mu.Unlock()
			if n == 1 {
				return client.Result{}, errors.New("read tcp: i/o timeout") // applied, response lost
			}
			return client.Result{ResourceID: id}, nil
		}}
	calls := 0
	model := agent.ModelFunc(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
		if r := lastResult(tr); r != nil && r.Error == "" || calls >= 2 {
			return agent.Turn{Text: "done"}, nil
		}
		calls++ // a failed call is asked for again, under a new call id
		return agent.Turn{Calls: []agent.ToolCall{{ID: "call-" + strconv.Itoa(calls), Name: "ship", Args: map[string]any{"order": "o-1"}}}}, nil
	})
	r := mustNew(t, agent.Config{Client: env.client, Model: model, Tools: []agent.Tool{ship}})
	runID := newRunID(t)
	out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("ship o-1")})
	if applied != 1 {
		t.Fatalf("the destination shipped %d times (status %q, results %+v)", applied, out.Status, results(out.Transcript))
	}
	if out.Status != agent.StatusError || !errors.Is(out.Err, client.ErrRetriesExhausted) || len(results(out.Transcript)) != 0 {
		t.Fatalf("status %q, err %v, results %+v; want error with the call pending", out.Status, out.Err, results(out.Transcript))
	}
	out = r.Run(context.Background(), agent.Input{RunID: runID, Transcript: out.Transcript})
	if res := results(out.Transcript); out.Status != agent.StatusDone || len(res) != 1 || res[0].ResourceID != "ship-1" || applied != 1 {
		t.Fatalf("resumed: status %q (%v), results %+v, shipped %d times; want done with ship-1", out.Status, out.Err, res, applied)
	}
}

// A read tool that ignores its context (a client call without one) is still
// bounded by its timeout: the model gets a timeout error for the call and
// the run goes on, as with a model that ignores its context.
func TestReadToolIgnoringItsTimeout(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	stuck := agent.Tool{Name: "fetch", Policy: client.ToolPolicy{Timeout: 20 * time.Millisecond},
		Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			<-release
			return client.Result{ResourceID: "too late"}, nil
		}}
	model := agent.ModelFunc(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
		if r := lastResult(tr); r != nil {
			return agent.Turn{Text: "fetch failed: " + r.Error}, nil
		}
		return agent.Turn{Calls: []agent.ToolCall{{ID: "c1", Name: "fetch", Args: map[string]any{"url": "u"}}}}, nil
	})
	r := mustNew(t, agent.Config{Model: model, Tools: []agent.Tool{stuck}})
	out := ended(t, runAsync(r, agent.Input{RunID: "r", Transcript: user("fetch u")}))
	res := results(out.Transcript)
	if out.Status != agent.StatusDone || len(res) != 1 || !strings.Contains(res[0].Error, "timed out") || res[0].ResourceID != "" {
		t.Fatalf("status %q (%s, %v), results %+v; want done with a timeout error", out.Status, out.Reason, out.Err, res)
	}
}
