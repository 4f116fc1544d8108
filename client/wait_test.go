package client_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// patience bounds how long a test waits for a Do that must return at its
// wait deadline: far beyond any wait deadline here, far below the waits the
// tests make Do face (a claim held until the test releases it, an hour of
// backoff), so only a Do that kept waiting reaches it.
const patience = 30 * time.Second

// room is how far ahead the tests set a wait deadline that must pass while
// Do waits (or while fn runs): far more than Do needs to get there (a
// Reserve, an attempt, a report) on a busy machine, so the deadline does not
// pass before, where Do would stop for another reason.
const room = 2 * time.Second

// slowBackoff makes every backoff an hour: a Do that waits one out never
// returns within patience.
var slowBackoff = client.WithBackoff(client.Backoff{Base: time.Hour, Max: time.Hour})

// doAsync runs Do on its own goroutine and returns its answer's channel.
func doAsync(ctx context.Context, c *client.Client, op client.Op, fn client.Func) <-chan error {
	done := make(chan error, 1)
	go func() { _, err := c.Do(ctx, op, fn); done <- err }()
	return done
}

// returned waits for Do's answer, for at most patience.
func returned(t *testing.T, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(patience):
		t.Fatalf("Do still waiting %s after %s: its wait deadline did not end the wait", what, patience)
		return nil
	}
}

// waitDeadlineError returns err as a *WaitDeadlineError, or fails the test.
func waitDeadlineError(t *testing.T, err error, want client.Wait) *client.WaitDeadlineError {
	t.Helper()
	var wd *client.WaitDeadlineError
	if !errors.Is(err, client.ErrWaitDeadline) || !errors.As(err, &wd) {
		t.Fatalf("Do = %v, want a *WaitDeadlineError", err)
	}
	if wd.Waiting != want {
		t.Fatalf("Do stopped waiting for %q, want %q (%v)", wd.Waiting, want, err)
	}
	if client.ClassOf(err) != client.Ambiguous {
		t.Fatalf("ClassOf(%v) = %v: a wait cut short proves nothing about the effect", err, client.ClassOf(err))
	}
	return wd
}

// Another holder's tool is running when the wait deadline comes: Do stops
// waiting on its claim (returning before that claim ends), says the outcome
// is unknown to it, and leaves the record as the holder has it. The holder
// finishes, and a later Do replays its result: one effect.
func TestDoWaitDeadlineEndsTheWaitOnAnotherHolder(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		op := e.op("held", "payments.refund", map[string]any{"amount": 1})
		release, started := make(chan struct{}), make(chan struct{})
		var once sync.Once
		free := func() { once.Do(func() { close(release) }) }
		t.Cleanup(free)
		var applied atomic.Int32
		holder := doAsync(e.ctx, e.c, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
			close(started)
			<-release
			applied.Add(1)
			return client.Result{ResourceID: "R-held"}, nil
		})
		<-started

		ctx := client.WithWaitDeadline(e.ctx, time.Now().Add(room))
		err := returned(t, doAsync(ctx, e.c, op, func(context.Context, client.Attempt) (client.Result, error) {
			t.Error("fn ran while another holder held the claim")
			return client.Result{}, nil
		}), "on another holder's claim")
		select {
		case <-holder:
			t.Fatal("the holder finished first: the wait deadline was not what ended the wait")
		default:
		}
		wd := waitDeadlineError(t, err, client.WaitInProgress)
		if wd.Operation == nil || wd.Operation.State != client.StateRunning {
			t.Fatalf("the error's record = %+v, want the holder's RUNNING claim", wd.Operation)
		}
		o, lerr := e.c.Lookup(e.ctx, op.ID)
		if lerr != nil {
			t.Fatal(lerr)
		}
		if r := strings.Join(reasons(o), ","); o.State != client.StateRunning || o.Attempt != 1 || r != "RESERVED" {
			t.Fatalf("after the wait was cut: %v attempt %d, history %s; want the holder's claim untouched", o.State, o.Attempt, r)
		}

		free()
		if err := <-holder; err != nil {
			t.Fatalf("the holder's Do = %v", err)
		}
		res, err := e.c.Do(e.ctx, op, func(context.Context, client.Attempt) (client.Result, error) {
			t.Error("fn ran again")
			return client.Result{}, nil
		})
		if err != nil || !res.Replayed || res.ResourceID != "R-held" || applied.Load() != 1 {
			t.Fatalf("Do again = %+v, %v; applied %d times, want a replay of the one effect", res, err, applied.Load())
		}
	}, slowBackoff) // every wait on the claim is an hour long
}

// A tool already running when the wait deadline passes is not cut: its
// context stays live, its effect is applied once and recorded, and Do
// returns its result.
func TestDoWaitDeadlineDoesNotCutARunningTool(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	op := e.op("long", "payments.refund", map[string]any{"amount": 1})
	ctx := client.WithWaitDeadline(e.ctx, time.Now().Add(room))
	var applied atomic.Int32
	res, err := e.c.Do(ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		wd, ok := client.WaitDeadline(ctx)
		if !ok {
			return client.Result{}, client.MarkFinal("test", errors.New("fn's context has no wait deadline"))
		}
		// Still running well after the deadline passed; a context cut by
		// it ends first.
		select {
		case <-ctx.Done():
			return client.Result{}, client.MarkFinal("test", ctx.Err()) // cut: nothing applied
		case <-time.After(time.Until(wd) + 100*time.Millisecond):
		}
		applied.Add(1)
		return client.Result{ResourceID: "R-long"}, nil
	})
	if err != nil || res.Replayed || res.ResourceID != "R-long" || applied.Load() != 1 {
		t.Fatalf("Do = %+v, %v; applied %d times; want the tool's own result, applied once", res, err, applied.Load())
	}
	o, err := e.c.Lookup(e.ctx, op.ID)
	if err != nil || o.State != client.StateSucceeded || o.Result == nil || o.Result.ResourceID != "R-long" {
		t.Fatalf("record = %+v, %v; want SUCCEEDED with the tool's result", o, err)
	}
}

// The wait deadline ends the backoff between attempts. After a retryable
// failure the operation stays PENDING; after an ambiguous one it stays
// UNKNOWN, and the error does not pass for "not applied".
func TestDoWaitDeadlineEndsTheBackoff(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t), slowBackoff)

	d := newDestination("refuse")
	op := e.op("refused", "payments.refund", map[string]any{"amount": 1})
	ctx := client.WithWaitDeadline(e.ctx, time.Now().Add(room))
	wd := waitDeadlineError(t, returned(t, doAsync(ctx, e.c, op, d.fn), "in the backoff"), client.WaitBackoff)
	if errors.Is(wd, client.ErrRetriesExhausted) || wd.Operation == nil || wd.Operation.State != client.StatePending || d.calls.Load() != 1 {
		t.Fatalf("Do = %v (record %+v, fn called %d times); want PENDING after one refused attempt", wd, wd.Operation, d.calls.Load())
	}
	if o, _ := e.c.Lookup(e.ctx, op.ID); o == nil || o.State != client.StatePending {
		t.Fatalf("record = %+v, want PENDING", o)
	}
	// A later call goes on under the same id.
	if res, err := e.c.Do(e.ctx, op, d.fn); err != nil || res.Attempt != 2 || d.totalApplied() != 1 {
		t.Fatalf("Do again = %+v, %v; applied %d", res, err, d.totalApplied())
	}

	amb := newDestination("timeout-after-write")
	op = e.op("ambiguous", "idempotent.sync", map[string]any{"profile": "p"})
	ctx = client.WithWaitDeadline(e.ctx, time.Now().Add(room))
	wd = waitDeadlineError(t, returned(t, doAsync(ctx, e.c, op, amb.fn), "in the backoff"), client.WaitBackoff)
	if wd.Operation == nil || wd.Operation.State != client.StateUnknown || amb.count(op.ID) != 1 {
		t.Fatalf("Do = %v (record %+v, applied %d); want UNKNOWN after the ambiguous attempt", wd, wd.Operation, amb.count(op.ID))
	}
}

// The wait deadline ends the wait for a reconciler's answer (the reconciler
// applies nothing; its context ends): the operation stays UNKNOWN, and a
// later call reconciles it instead of applying the effect again.
func TestDoWaitDeadlineEndsTheReconcilerWait(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	e.c.SetToolPolicy("payments.refund", client.ToolPolicy{Timeout: time.Hour, MaxRetries: 2})
	d := newDestination("timeout-after-write")
	var cut atomic.Value
	e.c.RegisterReconciler("payments.refund", func(ctx context.Context, o *client.Operation) (client.Finding, error) {
		<-ctx.Done() // a destination that does not answer
		cut.Store(ctx.Err())
		return client.Finding{}, ctx.Err()
	})
	op := e.op("silent", "payments.refund", map[string]any{"amount": 1})
	ctx := client.WithWaitDeadline(e.ctx, time.Now().Add(room))
	wd := waitDeadlineError(t, returned(t, doAsync(ctx, e.c, op, d.fn), "for the reconciler"), client.WaitReconciliation)
	if errors.Is(wd, client.ErrNeedsReconciliation) || wd.Operation == nil || wd.Operation.State != client.StateUnknown {
		t.Fatalf("Do = %v (record %+v)", wd, wd.Operation)
	}
	if err, _ := cut.Load().(error); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the reconciler's context ended with %v, want its deadline", err)
	}
	if o, _ := e.c.Lookup(e.ctx, op.ID); o == nil || o.State != client.StateUnknown {
		t.Fatalf("record = %+v, want UNKNOWN", o)
	}
	e.c.RegisterReconciler("payments.refund", d.reconciler)
	res, err := e.c.Do(e.ctx, op, d.fn)
	if err != nil || !res.Replayed || res.ResourceID != "R-1" || d.totalApplied() != 1 || d.calls.Load() != 1 {
		t.Fatalf("Do again = %+v, %v; applied %d, fn called %d times", res, err, d.totalApplied(), d.calls.Load())
	}
}

// The wait deadline ends the backoff before a Reserve is repeated while
// the ledger gives no answer; fn never runs.
func TestDoWaitDeadlineEndsTheLedgerBackoff(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t), slowBackoff, ledgerFault("Reserve", "unavailable"))
	d := newDestination()
	ctx := client.WithWaitDeadline(e.ctx, time.Now().Add(room))
	wd := waitDeadlineError(t, returned(t, doAsync(ctx, e.c, e.op("down", "payments.refund", nil), d.fn), "for the ledger"), client.WaitLedger)
	if !errors.Is(wd.Err, client.ErrUnavailable) || wd.Operation != nil || d.calls.Load() != 0 {
		t.Fatalf("Do = %v (record %+v, fn called %d times)", wd, wd.Operation, d.calls.Load())
	}
}

// A wait deadline already passed: Do does not ask the ledger at all.
func TestDoWaitDeadlineAlreadyPassed(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination()
	op := e.op("late", "payments.refund", nil)
	_, err := e.c.Do(client.WithWaitDeadline(e.ctx, time.Now().Add(-time.Second)), op, d.fn)
	if wd := waitDeadlineError(t, err, client.WaitNone); wd.Operation != nil || d.calls.Load() != 0 {
		t.Fatalf("Do = %v, fn called %d times", err, d.calls.Load())
	}
	if _, err := e.c.Lookup(e.ctx, op.ID); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Lookup = %v, want ErrNotFound: nothing reserved", err)
	}
}

// A claim whose Reserve answer arrives after the wait deadline is returned
// unused (FAILED_RETRYABLE): fn does not start after the deadline, and the
// operation is claimable again rather than UNKNOWN.
func TestDoWaitDeadlineReturnsALateClaim(t *testing.T) {
	var deadline atomic.Int64 // Unix ns, set once the ledger is up
	late := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if strings.HasSuffix(method, "/Reserve") {
			time.Sleep(time.Until(time.Unix(0, deadline.Load())) + time.Millisecond) // the answer arrives after the deadline
		}
		return err
	}))
	e := newEnv(t, redistest.Shared(t).Client(t), late)
	d := newDestination()
	op := e.op("late-claim", "payments.refund", nil)
	deadline.Store(time.Now().Add(room).UnixNano())
	_, err := e.c.Do(client.WithWaitDeadline(e.ctx, time.Unix(0, deadline.Load())), op, d.fn)
	wd := waitDeadlineError(t, err, client.WaitNone)
	if d.calls.Load() != 0 || wd.Operation == nil || wd.Operation.State != client.StatePending {
		t.Fatalf("Do = %v (record %+v), fn called %d times", err, wd.Operation, d.calls.Load())
	}
	o, _ := e.c.Lookup(e.ctx, op.ID)
	if r := strings.Join(reasons(o), ","); o.State != client.StatePending || r != "RESERVED,FAILED_RETRYABLE" {
		t.Fatalf("record %v, history %s; want the claim returned", o.State, r)
	}
}

// The reconciler has its finding when the wait deadline ends its context,
// and the finding settles the operation (the effect was found). Do knows
// the outcome then: it returns the found result, not a *WaitDeadlineError
// saying the outcome is unknown to it.
func TestDoWaitDeadlineReturnsAnOutcomeTheReconcilerSettled(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination("timeout-after-write")
	e.c.RegisterReconciler("payments.refund", func(ctx context.Context, o *client.Operation) (client.Finding, error) {
		<-ctx.Done() // the answer comes in as the deadline passes
		return d.reconciler(context.Background(), o)
	})
	op := e.op("found", "payments.refund", map[string]any{"amount": 1})
	ctx := client.WithWaitDeadline(e.ctx, time.Now().Add(room))
	res, err := e.c.Do(ctx, op, d.fn)
	if err != nil || !res.Replayed || res.ResourceID != "R-1" {
		t.Fatalf("Do = %+v, %v; want the result the reconciler found", res, err)
	}
	if o, _ := e.c.Lookup(e.ctx, op.ID); o == nil || o.State != client.StateSucceeded || d.totalApplied() != 1 {
		t.Fatalf("record = %+v, applied %d; want SUCCEEDED, applied once", o, d.totalApplied())
	}
}

// A reconciler that ignores its context (a destination's client without
// timeouts) does not hold Do past the tool's timeout: Do stops waiting for
// it and reports the operation as still needing reconciliation, running
// nothing.
func TestDoStopsWaitingForAReconcilerThatIgnoresItsContext(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	op := e.op("refund", "payments.refund", map[string]any{"amount": 1})
	r, err := e.c.Reserve(e.ctx, op, client.NewHolder())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.MarkUnknown(e.ctx, op.ID, r.Operation.FencingToken, "timeout"); err != nil {
		t.Fatal(err)
	}
	e.c.SetToolPolicy("payments.refund", client.ToolPolicy{Timeout: 100 * time.Millisecond})
	release := make(chan struct{})
	defer close(release)
	e.c.RegisterReconciler("payments.refund", func(ctx context.Context, o *client.Operation) (client.Finding, error) {
		<-release // ignores ctx
		return client.Finding{Kind: client.NotApplied}, nil
	})
	var runs atomic.Int32
	err = returned(t, doAsync(e.ctx, e.c, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		runs.Add(1)
		return client.Result{}, nil
	}), "for a reconciler that ignores its context")
	if !errors.Is(err, client.ErrNeedsReconciliation) || runs.Load() != 0 {
		t.Fatalf("Do = %v, fn ran %d times; want ErrNeedsReconciliation and no run", err, runs.Load())
	}
	if o, err := e.c.Lookup(e.ctx, op.ID); err != nil || o.State != client.StateUnknown {
		t.Fatalf("the record: %v, %v; want it still UNKNOWN", o, err)
	}
}
