package agent_test

import (
	"context"
	"strings"
	"testing"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
)

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
