package main

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// runDoc runs ledgerctl --json with args, which must exit 0, and decodes
// its document into v.
func runDoc(t *testing.T, env map[string]string, v any, args ...string) {
	t.Helper()
	o := must(t, env, append([]string{"--json"}, args...)...)
	if err := json.Unmarshal([]byte(o.stdout), v); err != nil {
		t.Fatalf("ledgerctl --json %q: %v: %s", args, err, o)
	}
	if o.stderr != "" || !strings.Contains(o.stdout, `"notices": [`) {
		t.Errorf("ledgerctl --json %q: want notices in the document and nothing on stderr: %s", args, o)
	}
}

// TestRuns: an operator reads a tenant's runs and ends one, after which
// the ledger admits no new step of it while its admitted operation still
// completes.
func TestRuns(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	ctx := context.Background()
	if _, err := e.sdk.StartRun(ctx, "run-loop", client.RunLimits{MaxSteps: 3, Deadline: 10 * time.Minute, MaxRepeats: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sdk.StartRun(ctx, "run-other", client.RunLimits{}); err != nil {
		t.Fatal(err)
	}
	r, err := e.sdk.Reserve(ctx, client.Op{ID: "loop-1", Tool: "tickets.create", RunID: "run-loop", Params: map[string]any{"n": 1}}, client.NewHolder())
	if err != nil || r.Decision != client.DecisionExecute {
		t.Fatalf("Reserve = %+v, %v", r, err)
	}

	var got jsonRunDocument
	runDoc(t, e.env, &got, "get-run", "run-loop")
	want := jsonRun{RunID: "run-loop", State: "RUN_STATE_RUNNING", Limits: jsonRunLimits{MaxSteps: 3, Deadline: "600s", MaxRepeats: 2},
		Steps: 1, IrreversibleSteps: 1, MostRepeats: 1, OpenOperations: 1, StartedBy: got.StartedBy, StartedAt: got.StartedAt, DeadlineAt: got.DeadlineAt}
	if got.jsonRun != want || got.StartedBy == "" || got.StartedAt == nil || got.DeadlineAt == nil {
		t.Errorf("get-run --json = %+v, want %+v with a principal, start and deadline", got.jsonRun, want)
	}
	text := must(t, e.env, "get-run", "run-loop").stdout
	for _, w := range []string{"state               RUNNING", "steps               1 of 3", "open operations     1", "(10m00s after the start)"} {
		if !strings.Contains(text, w) {
			t.Errorf("get-run lacks %q:\n%s", w, text)
		}
	}

	// Listing, in pages of one, and cut by --limit.
	defer func(n int) { maxRunPageSize = n }(maxRunPageSize)
	maxRunPageSize = 1
	var list jsonRunList
	runDoc(t, e.env, &list, "list-runs")
	if list.Count != 2 || len(list.Runs) != 2 || list.Truncated {
		t.Fatalf("list-runs --json = %+v, want both runs", list)
	}
	runDoc(t, e.env, &list, "list-runs", "--limit", "1")
	if list.Count != 1 || !list.Truncated || len(list.Notices) != 1 || list.Notices[0].Code != noticeMoreRemain {
		t.Errorf("list-runs --limit 1 --json = %+v, want one run, truncated, MORE_REMAIN", list)
	}
	if rows := tableIDs(must(t, e.env, "list-runs").stdout); len(rows) != 2 {
		t.Errorf("list-runs rows %q, want two", rows)
	}

	// Ending it: the same end again is harmless, another is refused.
	runDoc(t, e.env, &got, "end-run", "run-loop", "cancelled", "--reason", "looping on one ticket")
	if got.State != "RUN_STATE_CANCELLED" || got.EndReason != "looping on one ticket" || got.EndedAt == nil {
		t.Errorf("end-run --json = %+v, want CANCELLED with the reason and an end", got.jsonRun)
	}
	// Listing by state, still in pages of one.
	for _, c := range []struct {
		states []string
		want   []string
	}{
		{[]string{"--state", "cancelled"}, []string{"run-loop"}},
		{[]string{"--state", "running"}, []string{"run-other"}},
		{[]string{"--state", "RUN_STATE_DONE,Running"}, []string{"run-other"}},
		{[]string{"--state", "done", "--state", "step_limit"}, []string{}},
	} {
		runDoc(t, e.env, &list, append([]string{"list-runs"}, c.states...)...)
		ids := []string{}
		for _, r := range list.Runs {
			ids = append(ids, r.RunID)
		}
		if !slices.Equal(ids, c.want) || list.Truncated {
			t.Errorf("list-runs %v --json: %v, want %v", c.states, ids, c.want)
		}
	}
	must(t, e.env, "end-run", "run-loop", "cancelled", "--reason", "looping on one ticket")
	fails(t, e.env, 1, []string{"RUN_ENDED", "(RUN_STATE_CANCELLED)", "see ledgerctl get-run run-loop"}, "end-run", "run-loop", "done")
	_, err = e.sdk.Reserve(ctx, client.Op{ID: "loop-2", Tool: "tickets.create", RunID: "run-loop", Params: map[string]any{"n": 2}}, client.NewHolder())
	if !errors.Is(err, client.ErrRunEnded) {
		t.Errorf("a new step after end-run: %v, want ErrRunEnded", err)
	}
	if _, err := e.sdk.Complete(ctx, "loop-1", r.Operation.FencingToken, client.Result{ResourceID: "T-1"}); err != nil {
		t.Errorf("the admitted operation's Complete after end-run: %v", err)
	}
	runDoc(t, e.env, &got, "get-run", "run-loop")
	if got.Steps != 1 || got.OpenOperations != 0 {
		t.Errorf("after end-run and Complete: %+v, want 1 step and none open", got.jsonRun)
	}
}

// TestRunsRefused: bad usage exits 2 before anything is sent; the ledger's
// refusals exit 1 with a hint naming the run or the scope.
func TestRunsRefused(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	if _, err := e.sdk.StartRun(context.Background(), "run-1", client.RunLimits{}); err != nil {
		t.Fatal(err)
	}
	as := func(scope string) map[string]string {
		env := maps.Clone(e.env)
		env["LEDGER_API_KEY"] = e.keys.keys[scope]
		return env
	}
	for _, tc := range []struct {
		env  map[string]string
		code int
		want string
		args []string
	}{
		{e.env, 2, "get-run needs a run id", []string{"get-run"}},
		{e.env, 2, "takes one run id", []string{"get-run", "a", "b"}},
		{e.env, 2, "--reason is not a flag of get-run", []string{"get-run", "run-1", "--reason", "x"}},
		{e.env, 2, "list-runs takes no arguments", []string{"list-runs", "run-1"}},
		{e.env, 2, "--limit must be positive", []string{"list-runs", "--limit", "0"}},
		{e.env, 2, `--state: "pending" is not running, done, step-limit, deadline, repetition or cancelled`, []string{"list-runs", "--state", "running,pending"}},
		{e.env, 2, "needs a run id and how it ended", []string{"end-run", "run-1"}},
		{e.env, 2, `unknown end "finished"`, []string{"end-run", "run-1", "finished"}},
		{e.env, 2, "--reason is empty", []string{"end-run", "run-1", "done", "--reason", ""}},
		{e.env, 1, "check the run id", []string{"get-run", "no-such-run"}},
		{e.env, 1, "check the run id", []string{"end-run", "no-such-run", "done"}},
		{e.env, 1, "reason: longer than 256 bytes", []string{"end-run", "run-1", "done", "--reason", strings.Repeat("r", 257)}},
		{as("viewer"), 1, "end-run needs an API key with the agent or reconciler scope", []string{"end-run", "run-1", "done"}},
		{as("agent"), 1, "list-runs needs an API key with the reconciler or viewer scope", []string{"list-runs"}},
	} {
		fails(t, tc.env, tc.code, []string{tc.want}, tc.args...)
	}
	var got jsonRunDocument
	runDoc(t, as("viewer"), &got, "get-run", "run-1")
	if got.State != "RUN_STATE_RUNNING" {
		t.Errorf("the refusals changed the run: %+v", got.jsonRun)
	}
}
