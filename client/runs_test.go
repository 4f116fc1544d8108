package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// TestDoUnderARun: Do's calls in a run started with a cap run the tool
// until the cap; the next new operation is ErrRunEnded without running
// it, while a retry of an admitted one replays; the run's counts and end
// read back.
func TestDoUnderARun(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination()
	run := e.id("run")
	r, err := e.c.StartRun(e.ctx, run, client.RunLimits{MaxSteps: 2, MaxRepeats: 1, Deadline: time.Minute})
	if err != nil || r.State != client.RunRunning || r.Limits.MaxSteps != 2 || r.Limits.Deadline != time.Minute {
		t.Fatalf("StartRun = %+v, %v", r, err)
	}
	op := func(id string, amount int) client.Op {
		return client.Op{ID: e.id(id), Tool: "payments.refund", Params: map[string]any{"amount": amount}, RunID: run}
	}
	for i, o := range []client.Op{op("a", 1), op("b", 2)} {
		if _, err := e.c.Do(e.ctx, o, d.fn); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	_, err = e.c.Do(e.ctx, op("c", 3), d.fn)
	if rr, ok := client.RunOf(err); !errors.Is(err, client.ErrRunEnded) || !ok || rr.State != client.RunStepLimit || rr.Limit != "max_steps" {
		t.Fatalf("the step past the cap: %v (%+v)", err, rr)
	}
	if res, err := e.c.Do(e.ctx, op("a", 1), d.fn); err != nil || !res.Replayed {
		t.Fatalf("a retry after the end: %+v, %v", res, err)
	}
	if n := d.calls.Load(); n != 2 {
		t.Fatalf("the tool ran %d times, want 2", n)
	}
	got, err := e.c.GetRun(e.ctx, run)
	if err != nil || got.State != client.RunStepLimit || got.Steps != 2 || got.OpenOperations != 0 || got.EndedAt.IsZero() {
		t.Fatalf("GetRun = %+v, %v", got, err)
	}
	other := e.id("other")
	if _, err := e.c.StartRun(e.ctx, other, client.RunLimits{}); err != nil {
		t.Fatal(err)
	}
	if r, err := e.c.EndRun(e.ctx, other, client.RunCancelled, "stopped"); err != nil || r.State != client.RunCancelled {
		t.Fatalf("EndRun = %+v, %v", r, err)
	}
	if _, err := e.c.EndRun(e.ctx, other, client.RunDone, ""); !errors.Is(err, client.ErrRunEnded) {
		t.Fatalf("EndRun of an ended run: %v", err)
	}
	if _, err := e.c.StartRun(e.ctx, run, client.RunLimits{MaxSteps: 3}); !errors.Is(err, client.ErrKeyReused) {
		t.Fatalf("StartRun with other limits: %v", err)
	}
	if _, err := e.c.GetRun(e.ctx, e.id("never")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("GetRun of no run: %v", err)
	}
	page, err := e.c.ListRuns(e.ctx, 0, "")
	if err != nil || len(page.Runs) < 2 {
		t.Fatalf("ListRuns = %+v, %v", page, err)
	}
	if _, ok := client.RunOf(errors.New("other")); ok {
		t.Fatal("RunOf reads a run from another error")
	}
}
