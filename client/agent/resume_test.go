package agent_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
	"github.com/opledger/ledger/internal/redistest"
)

// strictOrder checks a transcript the way a strict model API does: the
// results of a turn's calls come directly after the turn, one per call, in
// call order, before any other message.
func strictOrder(transcript []agent.Message) error {
	var owed []agent.ToolCall // calls of the last turn still without a result
	for i, m := range transcript {
		if m.Role == agent.RoleTool {
			if len(owed) == 0 || m.Result == nil || m.Result.CallID != owed[0].ID {
				return fmt.Errorf("message %d: a tool result that does not directly follow its turn in call order", i)
			}
			owed = owed[1:]
			continue
		}
		if len(owed) > 0 {
			return fmt.Errorf("message %d (%s) comes before the result of call %s", i, m.Role, owed[0].ID)
		}
		if m.Role == agent.RoleAssistant {
			owed = m.Calls
		}
	}
	if len(owed) > 0 {
		return fmt.Errorf("call %s has no result", owed[0].ID)
	}
	return nil
}

// strict wraps a model: it fails, as a model API would, when the transcript
// breaks strictOrder.
func strict(m agent.ModelFunc) agent.ModelFunc {
	return func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
		if err := strictOrder(transcript); err != nil {
			return agent.Turn{}, fmt.Errorf("the model API refused the transcript: %w", err)
		}
		return m(ctx, transcript)
	}
}

// shape describes a transcript by roles and call ids: "u:text" for a user
// message, "a(c1,c2)" for a turn with calls, "a" for a final answer, "r:c1"
// for a result.
func shape(transcript []agent.Message) string {
	var parts []string
	for _, m := range transcript {
		switch m.Role {
		case agent.RoleUser:
			parts = append(parts, "u:"+m.Text)
		case agent.RoleAssistant:
			if len(m.Calls) == 0 {
				parts = append(parts, "a")
				continue
			}
			ids := make([]string, len(m.Calls))
			for i, c := range m.Calls {
				ids[i] = c.ID
			}
			parts = append(parts, "a("+strings.Join(ids, ",")+")")
		case agent.RoleTool:
			parts = append(parts, "r:"+m.Result.CallID)
		}
	}
	return strings.Join(parts, " ")
}

// recorder is a checkpoint that keeps every transcript it is handed, and its
// shape at that time, and can crash.
type recorder struct {
	mu     sync.Mutex
	saved  [][]agent.Message
	shapes []string
	crash  func(transcript []agent.Message) bool
}

func (r *recorder) save(ctx context.Context, runID string, transcript []agent.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.crash != nil && r.crash(transcript) {
		return errCrash
	}
	r.saved = append(r.saved, transcript)
	r.shapes = append(r.shapes, shape(transcript))
	return nil
}

// last returns the last saved transcript.
func (r *recorder) last() []agent.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.saved[len(r.saved)-1]
}

// unchanged checks that the transcripts handed to the checkpoint were not
// changed afterwards.
func (r *recorder) unchanged(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, tr := range r.saved {
		if got := shape(tr); got != r.shapes[i] {
			t.Errorf("checkpoint %d changed after it was saved: %q, was %q", i, got, r.shapes[i])
		}
	}
}

// A turn of three bookings, the worker crashing when it saves the result of
// call k+1 (its effect applied); the caller appends two user messages to
// the saved transcript and resumes. The pending calls run (the crashed one
// replays, the rest execute) and their results go after the turn's saved
// results, before the user's messages, so a model API that checks the order
// accepts the transcript: the run ends done, one effect per call.
func TestResumeWithMessagesAfterPendingCalls(t *testing.T) {
	rdb := redistest.Shared(t).Client(t)
	env := startLedger(t, rdb)
	calls := []agent.ToolCall{
		{ID: "c1", Name: "book", Args: map[string]any{"slot": "09:30"}},
		{ID: "c2", Name: "book", Args: map[string]any{"slot": "11:00"}},
		{ID: "c3", Name: "book", Args: map[string]any{"slot": "17:00"}},
	}
	model := strict(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
		if turns(tr) == 0 {
			return agent.Turn{Calls: calls}, nil
		}
		return agent.Turn{Text: "booked three"}, nil
	})
	for k := range len(calls) {
		t.Run(fmt.Sprintf("%d results saved", k), func(t *testing.T) {
			dest := newDestination()
			runID := newRunID(t)
			store := &recorder{crash: func(tr []agent.Message) bool { return len(results(tr)) == k+1 }}
			r := mustNew(t, agent.Config{Client: env.client, Model: model, Tools: []agent.Tool{bookTool(dest)}, Checkpoint: store.save})
			out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("book")})
			if out.Status != agent.StatusError || !errors.Is(out.Err, errCrash) || dest.total() != k+1 {
				t.Fatalf("first run: status %q (%v), %d effects; want the simulated crash after %d", out.Status, out.Err, dest.total(), k+1)
			}
			saved := store.last()
			if len(results(saved)) != k {
				t.Fatalf("saved %q; want %d results", shape(saved), k)
			}

			in := append(slices.Clip(saved), agent.Message{Role: agent.RoleUser, Text: "call me"}, agent.Message{Role: agent.RoleUser, Text: "mail me"})
			before := slices.Clone(in)
			store2 := &recorder{}
			r2 := mustNew(t, agent.Config{Client: dial(t, env.stack.Addr), Model: model, Tools: []agent.Tool{bookTool(dest)}, Checkpoint: store2.save})
			out = r2.Run(context.Background(), agent.Input{RunID: runID, Transcript: in})
			if out.Status != agent.StatusDone || out.Answer != "booked three" {
				t.Fatalf("resumed: status %q (%s, %v); want done", out.Status, out.Reason, out.Err)
			}
			if !reflect.DeepEqual(in, before) {
				t.Fatalf("the input transcript was modified: %q, was %q", shape(in), shape(before))
			}

			// Each pending call applied its effect once, in total one per
			// call; the one the crash left without a result replayed.
			res := results(out.Transcript)
			dest.mu.Lock()
			defer dest.mu.Unlock()
			for i, c := range calls {
				ids := dest.byOp[runID+":"+c.ID]
				if len(ids) != 1 || res[i].CallID != c.ID || res[i].ResourceID != ids[0] || res[i].Replayed != (i == k) {
					t.Fatalf("call %s: effects %v, result %+v; want one effect, replayed only for c%d", c.ID, ids, res[i], k+1)
				}
			}
			if dest.created != len(calls) {
				t.Fatalf("the destination applied %d effects, want %d", dest.created, len(calls))
			}

			// Every checkpoint of the resumed run has the results in place.
			want := []string{}
			for j := k + 1; j <= len(calls); j++ {
				tr := "u:book a(c1,c2,c3)"
				for i := 1; i <= j; i++ {
					tr += fmt.Sprintf(" r:c%d", i)
				}
				want = append(want, tr+" u:call me u:mail me")
			}
			want = append(want, want[len(want)-1]+" a")
			if !slices.Equal(store2.shapes, want) {
				t.Fatalf("checkpoints\n%q\nwant\n%q", store2.shapes, want)
			}
			if got := shape(out.Transcript); got != want[len(want)-1] {
				t.Fatalf("outcome transcript %q, want %q", got, want[len(want)-1])
			}
			if err := strictOrder(store2.last()); err != nil {
				t.Fatalf("saved transcript: %v", err)
			}
			store2.unchanged(t)
		})
	}
}

// A run stopped by its caller's context between two calls of a resumed
// turn: the finished call's result goes after the turn's saved results, the
// call not started stays pending (no result), and a second resumption puts
// its result after them, still before the user's message.
func TestResumeStoppedAgainKeepsResultsInPlace(t *testing.T) {
	var lookups []string
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tools := []agent.Tool{
		{Name: "lookup", Func: func(_ context.Context, c agent.Call) (client.Result, error) {
			lookups = append(lookups, c.ID)
			return client.Result{}, nil
		}},
		{Name: "stop", Func: func(_ context.Context, c agent.Call) (client.Result, error) {
			lookups = append(lookups, c.ID)
			cancel() // the caller gives up while this call runs
			return client.Result{}, nil
		}},
	}
	model := strict(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
		return agent.Turn{Text: "found"}, nil
	})
	turn := agent.Message{Role: agent.RoleAssistant, Calls: []agent.ToolCall{
		{ID: "c1", Name: "lookup"}, {ID: "c2", Name: "stop"}, {ID: "c3", Name: "lookup"},
	}}
	in := []agent.Message{{Role: agent.RoleUser, Text: "find"}, turn,
		{Role: agent.RoleTool, Result: &agent.ToolResult{CallID: "c1", Tool: "lookup"}},
		{Role: agent.RoleUser, Text: "hurry"}}
	store := &recorder{}
	r := mustNew(t, agent.Config{Model: model, Tools: tools, Checkpoint: store.save})

	out := r.Run(ctx, agent.Input{RunID: "r", Transcript: in})
	if out.Status != agent.StatusError || !errors.Is(out.Err, context.Canceled) {
		t.Fatalf("status %q (%s, %v); want error: the context ended", out.Status, out.Reason, out.Err)
	}
	if got, want := shape(out.Transcript), "u:find a(c1,c2,c3) r:c1 r:c2 u:hurry"; got != want || shape(store.last()) != want {
		t.Fatalf("transcript %q, saved %q; want %q (c3 pending)", got, shape(store.last()), want)
	}

	out = r.Run(context.Background(), agent.Input{RunID: "r", Transcript: store.last()})
	if out.Status != agent.StatusDone {
		t.Fatalf("resumed: status %q (%s, %v); want done", out.Status, out.Reason, out.Err)
	}
	if got, want := shape(store.last()), "u:find a(c1,c2,c3) r:c1 r:c2 r:c3 u:hurry a"; got != want {
		t.Fatalf("saved %q, want %q", got, want)
	}
	if strings.Join(lookups, ",") != "c2,c3" {
		t.Fatalf("calls run %v; want c2, then c3 on the second resumption", lookups)
	}
	store.unchanged(t)
}

// The repetition guard's result for a pending call of a resumed turn goes
// after the turn, before the user's message appended to it; resumed again,
// the run goes on to the model, which accepts the order.
func TestResumeRepetitionResultInPlace(t *testing.T) {
	rdb := redistest.Shared(t).Client(t)
	env := startLedger(t, rdb)
	dest := newDestination()
	args := map[string]any{"slot": "09:30"}
	model := strict(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
		if n := turns(tr); n < 2 {
			return agent.Turn{Calls: []agent.ToolCall{{ID: fmt.Sprintf("c%d", n+1), Name: "book", Args: args}}}, nil
		}
		return agent.Turn{Text: "booked once"}, nil
	})
	store := &recorder{crash: func(tr []agent.Message) bool { return turns(tr) == 2 }}
	cfg := agent.Config{Client: env.client, Model: model, Tools: []agent.Tool{bookTool(dest)}, RepeatLimit: 2, Checkpoint: store.save}
	runID := newRunID(t)
	out := mustNew(t, cfg).Run(context.Background(), agent.Input{RunID: runID, Transcript: user("book")})
	if out.Status != agent.StatusError || !errors.Is(out.Err, errCrash) {
		t.Fatalf("first run: status %q (%v); want the simulated crash", out.Status, out.Err)
	}
	// The transcript as the crash left it: the second turn's call pending.
	in := append(out.Transcript, agent.Message{Role: agent.RoleUser, Text: "only once"})

	store.crash = nil
	out = mustNew(t, cfg).Run(context.Background(), agent.Input{RunID: runID, Transcript: in})
	if out.Status != agent.StatusRepetition {
		t.Fatalf("resumed: status %q (%s, %v); want repetition", out.Status, out.Reason, out.Err)
	}
	want := "u:book a(c1) r:c1 a(c2) r:c2 u:only once"
	if got := shape(out.Transcript); got != want || shape(store.last()) != want {
		t.Fatalf("transcript %q, saved %q; want %q", got, shape(store.last()), want)
	}
	if r := results(out.Transcript)[1]; !strings.Contains(r.Error, "not run") {
		t.Fatalf("result of c2: %+v; want the guard's refusal", r)
	}

	out = mustNew(t, cfg).Run(context.Background(), agent.Input{RunID: runID, Transcript: out.Transcript})
	if out.Status != agent.StatusDone || out.Answer != "booked once" {
		t.Fatalf("resumed again: status %q (%s, %v); want done", out.Status, out.Reason, out.Err)
	}
	if got := dest.total(); got != 1 {
		t.Fatalf("the destination applied %d effects, want 1", got)
	}
	store.unchanged(t)
}
