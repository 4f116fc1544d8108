package agent_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
	"github.com/opledger/ledger/internal/redistest"
)

// A model (or its adapter) that numbers call ids per turn sends call_0 for
// a second, different booking. The ledger refuses it (the operation
// run_id:call_0 is the first booking's, left untouched); the model learns
// that the id was taken, asks again under a new id, and the run ends done
// with one appointment per intent. Resuming from the transcript saved
// before the refusal's result gives the model the same answer.
func TestCallIDReusedForAnotherCall(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb)
		dest := newDestination()
		first := agent.ToolCall{ID: "call_0", Name: "book", Args: map[string]any{"slot": "09:30"}}
		second := agent.ToolCall{ID: "call_0", Name: "book", Args: map[string]any{"slot": "17:00"}}
		model := agent.ModelFunc(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
			switch turns(tr) {
			case 0:
				return agent.Turn{Calls: []agent.ToolCall{first}}, nil
			case 1:
				return agent.Turn{Calls: []agent.ToolCall{second}}, nil
			case 2:
				if r := lastResult(tr); r == nil || r.Error == "" {
					return agent.Turn{Text: "booked twice"}, nil
				}
				return agent.Turn{Calls: []agent.ToolCall{{ID: "call_1", Name: "book", Args: second.Args}}}, nil
			}
			return agent.Turn{Text: "booked twice"}, nil
		})
		store := &checkpoints{}
		runID := newRunID(t)
		r := mustNew(t, agent.Config{Client: env.client, Model: model, Tools: []agent.Tool{bookTool(dest)}, Checkpoint: store.save})
		out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("book 09:30 and 17:00")})
		if out.Status != agent.StatusDone || out.Err != nil {
			t.Fatalf("status %q (%s, %v); want done", out.Status, out.Reason, out.Err)
		}
		res := results(out.Transcript)
		if len(res) != 3 || res[0].Error != "" || res[2].Error != "" || res[2].Replayed || res[0].ResourceID == res[2].ResourceID {
			t.Fatalf("results %+v; want the first booking, the refusal, the second booking", res)
		}
		if !strings.Contains(res[1].Error, `"call_0"`) || res[1].ResourceID != "" || res[1].Replayed {
			t.Fatalf("result of the reused id: %+v; want an error naming the call id", res[1])
		}
		if got := dest.total(); got != 2 {
			t.Fatalf("the destination applied %d effects, want 2 (one per intent)", got)
		}
		op, err := env.client.Lookup(context.Background(), runID+":call_0")
		if err != nil || op.State != client.StateSucceeded || op.Result == nil || op.Result.ResourceID != res[0].ResourceID {
			t.Fatalf("record of call_0: %+v, %v; want the first booking's", op, err)
		}

		// The transcript saved with the reused id pending (turn 2, no result).
		saved := out.Transcript[:4]
		if saved[3].Role != agent.RoleAssistant || saved[3].Calls[0].Args["slot"] != "17:00" {
			t.Fatalf("transcript %+v", out.Transcript)
		}
		resumed := mustNew(t, agent.Config{Client: dial(t, env.stack.Addr), Model: model, Tools: []agent.Tool{bookTool(dest)}})
		o := resumed.Run(context.Background(), agent.Input{RunID: runID, Transcript: saved})
		if rr := results(o.Transcript); o.Status != agent.StatusDone || len(rr) != 3 || rr[1].Error != res[1].Error || rr[2].ResourceID != res[2].ResourceID || !rr[2].Replayed {
			t.Fatalf("resumed: status %q (%s, %v), results %+v", o.Status, o.Reason, o.Err, rr)
		}
		if got := dest.total(); got != 2 {
			t.Fatalf("after the resumption the destination applied %d effects, want 2", got)
		}
	})
}

// One turn with two calls under the same id: the worker crashes after the
// first call's result is saved. The resumed run still owes the second call
// its result (it is pending), instead of taking the first call's result for
// it.
func TestDuplicateCallIDInOneTurnResumed(t *testing.T) {
	var searches []string
	search := agent.Tool{Name: "search", Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
		q, _ := c.Args["q"].(string)
		searches = append(searches, q)
		return client.Result{Data: map[string]any{"q": q}}, nil
	}}
	turn := []agent.ToolCall{
		{ID: "c", Name: "search", Args: map[string]any{"q": "dentist"}},
		{ID: "c", Name: "search", Args: map[string]any{"q": "optician"}},
	}
	var seen []agent.ToolResult
	model := agent.ModelFunc(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
		if turns(tr) == 0 {
			return agent.Turn{Calls: turn}, nil
		}
		seen = results(tr)
		return agent.Turn{Text: "found"}, nil
	})
	store := &checkpoints{crash: func(tr []agent.Message) bool { return len(results(tr)) == 2 }}
	r := mustNew(t, agent.Config{Model: model, Tools: []agent.Tool{search}, Checkpoint: store.save})
	runID := newRunID(t)
	if out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("search")}); out.Status != agent.StatusError {
		t.Fatalf("first run: status %q (%v); want the simulated crash", out.Status, out.Err)
	}
	saved := store.load()
	if len(results(saved)) != 1 {
		t.Fatalf("saved %+v; want the first result only", saved)
	}
	store.crash = nil
	out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: saved})
	if out.Status != agent.StatusDone {
		t.Fatalf("resumed: status %q (%s, %v)", out.Status, out.Reason, out.Err)
	}
	if len(seen) != 2 || seen[0].Data["q"] != "dentist" || seen[1].Data["q"] != "optician" {
		t.Fatalf("the model saw %+v; want one result per call", seen)
	}
	if strings.Join(searches, ",") != "dentist,optician,optician" {
		t.Fatalf("searches %v; want the second call run again on resumption", searches)
	}
}
