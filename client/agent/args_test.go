package agent_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/internal/redistest"
)

// Arguments built in Go with typed slices and maps ([]string,
// map[string]string, []int) are converted to JSON values, as results are:
// the mutating tool runs once and its operation is fingerprinted as the
// same arguments in JSON form, so a resumed run whose transcript came back
// from JSON storage replays the call instead of being refused as another
// request under the same key. Integers a double cannot carry exactly are
// still refused.
func TestTypedArgumentsAreConvertedToJSONValues(t *testing.T) {
	env := startLedger(t, redistest.Shared(t).Client(t))
	var runs, reads atomic.Int32
	tools := []agent.Tool{
		{Name: "tag", Mutating: true, Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			runs.Add(1)
			return client.Result{ResourceID: "t-1"}, nil
		}},
		{Name: "find", Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			reads.Add(1)
			return client.Result{ResourceID: "f-1"}, nil
		}},
	}
	typed := map[string]any{"ids": []string{"a", "b"}, "labels": map[string]string{"k": "v"}, "counts": []int{1, 2}}
	asJSON := map[string]any{"ids": []any{"a", "b"}, "labels": map[string]any{"k": "v"}, "counts": []any{1.0, 2.0}}
	run := func(runID string, args map[string]any) agent.Outcome {
		calls := []agent.ToolCall{{ID: "call-1", Name: "tag", Args: args}, {ID: "call-2", Name: "find", Args: args}}
		model := agent.ModelFunc(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
			if len(results(tr)) == len(calls) {
				return agent.Turn{Text: "done"}, nil
			}
			return agent.Turn{Calls: calls}, nil
		})
		return mustNew(t, agent.Config{Client: env.client, Model: model, Tools: tools}).
			Run(context.Background(), agent.Input{RunID: runID, PermitID: "p", Transcript: user("tag them")})
	}
	runID := newRunID(t)
	out := run(runID, typed)
	if res := results(out.Transcript); out.Status != agent.StatusDone || len(res) != 2 || res[0].Error != "" || res[1].Error != "" {
		t.Fatalf("status %q (%v), results %+v; want both calls run", out.Status, out.Err, res)
	}
	if runs.Load() != 1 || reads.Load() != 1 {
		t.Fatalf("tag ran %d times, find %d; want 1 and 1", runs.Load(), reads.Load())
	}
	op, err := env.client.Lookup(context.Background(), runID+":call-1")
	if err != nil || op.State != client.StateSucceeded {
		t.Fatalf("operation = %+v, %v; want SUCCEEDED", op, err)
	}
	want, err := fingerprint.Compute(asJSON, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := op.ParamsSHA256; string(got) != string(want[:]) {
		t.Fatalf("params_sha256 = %x, want the JSON form's %x", got, want[:])
	}
	// The same run again, its arguments as JSON storage gives them back:
	// replayed, not run again.
	out = run(runID, asJSON)
	if res := results(out.Transcript); out.Status != agent.StatusDone || len(res) != 2 || !res[0].Replayed || res[0].Error != "" {
		t.Fatalf("again: status %q (%v), results %+v; want the call replayed", out.Status, out.Err, res)
	}
	if runs.Load() != 1 {
		t.Fatalf("tag ran %d times, want 1", runs.Load())
	}
	// An integer the wire's doubles would round is still refused.
	out = run(newRunID(t), map[string]any{"ids": []int64{1<<53 + 1}})
	if res := results(out.Transcript); len(res) != 2 || res[0].Error == "" || res[1].Error == "" || runs.Load() != 1 {
		t.Fatalf("status %q, results %+v, tag ran %d times; want both refused", out.Status, res, runs.Load())
	}
}
