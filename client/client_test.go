package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
	"github.com/opledger/ledger/receipt"
	"github.com/opledger/ledger/server"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// fast keeps the tests' retries short.
var fast = client.WithBackoff(client.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond})

type env struct {
	c     *client.Client
	stack *servicetest.Stack
	rdb   redis.UniversalClient
	ctx   context.Context
	name  string
}

func (e *env) id(s string) string { return e.name + ":" + s }

func newEnv(t *testing.T, rdb redis.UniversalClient, opts ...client.Option) *env {
	t.Helper()
	st := servicetest.Start(t, rdb, servicetest.Options{Policy: ledgertest.Policy})
	c, err := client.Dial(st.Addr, append([]client.Option{fast}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &env{c: c, stack: st, rdb: rdb, ctx: context.Background(), name: t.Name() + "-" + client.NewHolder()[2:10]}
}

func eachBackend(t *testing.T, f func(t *testing.T, e *env), opts ...client.Option) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) { f(t, newEnv(t, rdb, opts...)) })
}

// destination applies every request (it honours no idempotency key), with
// faults injected in order, and answers reconcilers by operation id.
type destination struct {
	mu      sync.Mutex
	applied map[string][]string
	total   int
	faults  []string
	calls   atomic.Int32
}

func newDestination(faults ...string) *destination {
	return &destination{applied: map[string][]string{}, faults: faults}
}

var errTimeout = errors.New("read tcp: i/o timeout")

// fn is the tool: it applies the effect keyed by the operation id.
func (d *destination) fn(ctx context.Context, a client.Attempt) (client.Result, error) {
	d.calls.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	f := ""
	if len(d.faults) > 0 {
		f, d.faults = d.faults[0], d.faults[1:]
	}
	switch f {
	case "refuse": // refused before writing: proven not applied
		return client.Result{}, client.MarkRetryable(errors.New("503 service unavailable"))
	case "timeout-no-write":
		return client.Result{}, errTimeout
	case "declined":
		return client.Result{}, client.MarkFinal("declined", errors.New("card declined"))
	case "declined-message":
		return client.Result{}, client.MarkFinalMessage("declined", "card declined: "+strings.Repeat("é", 600), errors.New("card declined"))
	case "declined-detail":
		return client.Result{}, client.MarkFinalDetail("declined", "card 4242 declined: "+strings.Repeat("é", 40<<10), errors.New("card declined"))
	}
	d.total++
	rid := fmt.Sprintf("R-%d", d.total)
	d.applied[a.IdempotencyKey] = append(d.applied[a.IdempotencyKey], rid)
	if f == "timeout-after-write" {
		return client.Result{}, errTimeout
	}
	return client.Result{ResourceID: rid, Data: map[string]any{"receipt": rid}}, nil
}

// reconciler asks the destination whether the effect exists.
func (d *destination) reconciler(ctx context.Context, op *client.Operation) (client.Finding, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rs := d.applied[op.ID]; len(rs) > 0 {
		return client.Finding{Kind: client.Applied, Result: client.Result{ResourceID: rs[0], Data: map[string]any{"receipt": rs[0]}}, Note: "found"}, nil
	}
	return client.Finding{Kind: client.NotApplied, Note: "not found"}, nil
}

func (d *destination) totalApplied() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.total
}

func (d *destination) count(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.applied[id])
}

func (e *env) op(name, tool string, params map[string]any) client.Op {
	return client.Op{ID: e.id(name), Tool: tool, Params: params, PermitID: "permit-1", RunID: e.name}
}

func reasons(o *client.Operation) []string {
	var out []string
	for _, h := range o.History {
		out = append(out, h.Reason)
	}
	return out
}

func TestS2DoExecutesOnceThenReplays(t *testing.T) { // S2
	eachBackend(t, func(t *testing.T, e *env) {
		d := newDestination()
		op := e.op("refund", "payments.refund", map[string]any{"charge": "ch_1", "amount": 1250})
		first, err := e.c.Do(e.ctx, op, d.fn)
		if err != nil || first.Replayed || first.ResourceID != "R-1" || first.Attempt != 1 {
			t.Fatalf("first Do = %+v, %v", first, err)
		}
		// The agent lost that answer and retries the whole call.
		again, err := e.c.Do(e.ctx, op, d.fn)
		if err != nil || !again.Replayed || again.ResourceID != "R-1" || again.Data["receipt"] != "R-1" {
			t.Fatalf("retried Do = %+v, %v", again, err)
		}
		if n := d.count(op.ID); n != 1 || d.calls.Load() != 1 {
			t.Fatalf("effect applied %d times, fn called %d times; want 1 and 1", n, d.calls.Load())
		}
	})
}

// dropper loses the response of the next call of an armed method after the
// server handled it.
type dropper struct {
	mu    sync.Mutex
	armed map[string]int
}

func (d *dropper) arm(method string, times int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed[method] = times
}

func (d *dropper) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	name := method[strings.LastIndexByte(method, '/')+1:]
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.armed[name] > 0 {
		d.armed[name]--
		return status.Error(codes.Unavailable, "response lost")
	}
	return err
}

func withDropper() (*dropper, client.Option) {
	d := &dropper{armed: map[string]int{}}
	return d, client.WithDialOptions(grpc.WithChainUnaryInterceptor(d.intercept))
}

func TestS10DoRecoversLostResponses(t *testing.T) { // S10, and S2's lost Complete response
	dr, opt := withDropper()
	eachBackend(t, func(t *testing.T, e *env) {
		d := newDestination()
		op := e.op("refund", "payments.refund", map[string]any{"amount": 1})
		dr.arm("Reserve", 1)
		dr.arm("Complete", 1)
		res, err := e.c.Do(e.ctx, op, d.fn)
		if err != nil || res.ResourceID != "R-1" || res.Attempt != 1 {
			t.Fatalf("Do = %+v, %v", res, err)
		}
		got, err := e.c.Lookup(e.ctx, op.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r := strings.Join(reasons(got), ","); r != "RESERVED,SUCCEEDED" || got.Attempt != 1 {
			t.Fatalf("attempt %d, history %s: the lost responses left a trace", got.Attempt, r)
		}
		if d.calls.Load() != 1 || d.count(op.ID) != 1 {
			t.Fatalf("fn called %d times", d.calls.Load())
		}
	}, opt)
}

func TestS3DoWorkerDiedAfterEffect(t *testing.T) { // S3
	eachBackend(t, func(t *testing.T, e *env) {
		d := newDestination()
		op := e.op("refund", "expiring.refund", map[string]any{"amount": 1})
		// A worker reserves, applies the effect, and dies before Complete.
		res, err := e.c.Reserve(e.ctx, op, client.NewHolder())
		if err != nil || res.Decision != client.DecisionExecute {
			t.Fatalf("Reserve = %v, %v", res, err)
		}
		if _, err := d.fn(e.ctx, client.Attempt{OperationID: op.ID, IdempotencyKey: op.ID}); err != nil {
			t.Fatal(err)
		}
		// Without a reconciler the SDK stops: it must not run fn again.
		// (It waits out the dead worker's lease first.)
		_, err = e.c.Do(e.ctx, op, d.fn)
		if !errors.Is(err, client.ErrNeedsReconciliation) {
			t.Fatalf("Do without a reconciler = %v, want ErrNeedsReconciliation", err)
		}
		// With one, the effect is found and replayed.
		e.c.RegisterReconciler("expiring.refund", d.reconciler)
		got, err := e.c.Do(e.ctx, op, d.fn)
		if err != nil || got.ResourceID != "R-1" || !got.Replayed {
			t.Fatalf("Do with a reconciler = %+v, %v", got, err)
		}
		if d.count(op.ID) != 1 || d.calls.Load() != 1 {
			t.Fatalf("effect applied %d times, fn called %d times", d.count(op.ID), d.calls.Load())
		}
		o, _ := e.c.Lookup(e.ctx, op.ID)
		if r := strings.Join(reasons(o), ","); r != "RESERVED,LEASE_EXPIRED,RECONCILED_APPLIED" {
			t.Fatalf("history = %s", r)
		}
	})
}

func TestS5DoTimeoutThenReconciliation(t *testing.T) { // S5
	eachBackend(t, func(t *testing.T, e *env) {
		for _, tc := range []struct {
			fault     string
			wantHist  string
			wantCalls int32
		}{
			{"timeout-after-write", "RESERVED,MARKED_UNKNOWN,RECONCILED_APPLIED", 1},
			{"timeout-no-write", "RESERVED,MARKED_UNKNOWN,RECONCILED_NOT_APPLIED,CLAIMED,SUCCEEDED", 2},
		} {
			d := newDestination(tc.fault)
			e.c.RegisterReconciler("payments.refund", d.reconciler)
			op := e.op(tc.fault, "payments.refund", map[string]any{"amount": 1})
			res, err := e.c.Do(e.ctx, op, d.fn)
			if err != nil || res.ResourceID != "R-1" {
				t.Fatalf("%s: Do = %+v, %v", tc.fault, res, err)
			}
			if d.count(op.ID) != 1 || d.calls.Load() != tc.wantCalls {
				t.Fatalf("%s: effect applied %d times, fn called %d times", tc.fault, d.count(op.ID), d.calls.Load())
			}
			o, _ := e.c.Lookup(e.ctx, op.ID)
			if r := strings.Join(reasons(o), ","); r != tc.wantHist {
				t.Fatalf("%s: history = %s, want %s", tc.fault, r, tc.wantHist)
			}
		}
	})
}

// TestDoLeavesEscalatedOperationsToAHuman: an operation escalated to a
// human answers RECONCILE to every Reserve, an idempotent one too, and Do
// does not ask its reconciler: it returns the escalation, until a human's
// finding releases the operation.
func TestDoLeavesEscalatedOperationsToAHuman(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		for _, tool := range []string{"payments.refund", "idempotent.refund"} {
			d := newDestination()
			var asked atomic.Int32
			e.c.RegisterReconciler(tool, func(ctx context.Context, op *client.Operation) (client.Finding, error) {
				asked.Add(1)
				return d.reconciler(ctx, op)
			})
			e.c.SetToolPolicy(tool, client.ToolPolicy{Timeout: time.Second})
			op := e.op("escalated-"+tool, tool, map[string]any{"amount": 1})
			reserved, err := e.c.Reserve(e.ctx, op, client.NewHolder())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.MarkUnknown(e.ctx, op.ID, reserved.Operation.FencingToken, "the worker cannot tell"); err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.Reconcile(e.ctx, op.ID, client.Finding{Kind: client.Escalate, Note: "the bank does not answer"}); err != nil {
				t.Fatal(err)
			}
			var re *client.ReconcileError
			for range 2 {
				if _, err := e.c.Do(e.ctx, op, d.fn); !errors.As(err, &re) || !re.Escalated {
					t.Fatalf("%s: Do of the escalated operation = %v, want the escalation", tool, err)
				}
			}
			if asked.Load() != 0 || d.calls.Load() != 0 {
				t.Fatalf("%s: the reconciler was asked %d times and fn called %d times, want neither", tool, asked.Load(), d.calls.Load())
			}
			human := client.Finding{Kind: client.NotApplied, Note: "checked by hand", FencingToken: reserved.Operation.FencingToken}
			if _, err := e.c.Reconcile(e.ctx, op.ID, human); err != nil {
				t.Fatal(err)
			}
			if res, err := e.c.Do(e.ctx, op, d.fn); err != nil || res.Replayed || d.count(op.ID) != 1 {
				t.Fatalf("%s: Do after the human's finding = %+v, %v (%d effects)", tool, res, err, d.count(op.ID))
			}
		}
	})
}

func TestS9DoAppointmentWithFaults(t *testing.T) { // S9 through the SDK
	eachBackend(t, func(t *testing.T, e *env) {
		clinic := newDestination("refuse", "timeout-after-write")
		e.c.RegisterReconciler("create_appointment", clinic.reconciler)
		slot := map[string]any{"patient": "p-17", "start": "2026-12-03T09:30:00Z"}
		op := e.op("book", "create_appointment", slot)
		got := make([]string, 5)
		var wg sync.WaitGroup
		for i := range 2 { // sends 1 and 2, concurrently, through the faults
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := e.c.Do(e.ctx, op, clinic.fn)
				if err != nil {
					t.Error(err)
				}
				got[i] = r.ResourceID
			}()
		}
		wg.Wait()
		for i := 2; i < 5; i++ { // the agent crashed after the response, and sends it again
			r, err := e.c.Do(e.ctx, op, clinic.fn)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = r.ResourceID
		}
		for _, g := range got {
			if g != got[0] || g == "" {
				t.Fatalf("sends returned %v", got)
			}
		}
		if n := clinic.count(op.ID); n != 1 {
			t.Fatalf("%d appointments, want exactly 1", n)
		}
		changed := e.op("book", "create_appointment", map[string]any{"patient": "p-17", "start": "2026-12-04T09:30:00Z"})
		if _, err := e.c.Do(e.ctx, changed, clinic.fn); !errors.Is(err, client.ErrKeyReused) {
			t.Fatalf("a different payload under the key = %v, want ErrKeyReused", err)
		}
		second, err := e.c.Do(e.ctx, e.op("book-2", "create_appointment", slot), clinic.fn)
		if err != nil || second.ResourceID == got[0] {
			t.Fatalf("a new key = %+v, %v", second, err)
		}
		if n := clinic.totalApplied(); n != 2 {
			t.Fatalf("%d appointments in all, want 2", n)
		}
	})
}

func TestDoConflictNeverMintsAKey(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	e := newEnv(t, rdb)
	d := newDestination()
	op := e.op("refund", "payments.refund", map[string]any{"amount": 10})
	if _, err := e.c.Do(e.ctx, op, d.fn); err != nil {
		t.Fatal(err)
	}
	op.Params = map[string]any{"amount": 1000}
	_, err := e.c.Do(e.ctx, op, d.fn)
	var le *client.Error
	if !errors.Is(err, client.ErrKeyReused) || !errors.As(err, &le) || le.Metadata["differs"] != "params" {
		t.Fatalf("Do = %v, want ErrKeyReused naming params", err)
	}
	if d.calls.Load() != 1 {
		t.Fatalf("fn called %d times", d.calls.Load())
	}
	keys, err := rdb.Keys(e.ctx, "*:op:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("records in the store: %v (%v); want exactly the one operation", keys, err)
	}
}

func TestS6DoNeverRunsWithoutAReservation(t *testing.T) { // S6, client side
	t.Run("ledger down", func(t *testing.T) {
		e := newEnv(t, redistest.Shared(t).Client(t), client.WithLedgerRetries(2), client.WithCallTimeout(500*time.Millisecond))
		e.stack.Service.GRPC.Stop()
		d := newDestination()
		_, err := e.c.Do(e.ctx, e.op("x", "payments.refund", nil), d.fn)
		if !errors.Is(err, client.ErrUnavailable) || d.calls.Load() != 0 {
			t.Fatalf("Do = %v with fn called %d times; want ErrUnavailable and 0", err, d.calls.Load())
		}
	})
	t.Run("store down", func(t *testing.T) {
		srv := redistest.Start(t)
		e := newEnv(t, srv.Client(t), client.WithLedgerRetries(1))
		srv.Stop()
		d := newDestination()
		_, err := e.c.Do(e.ctx, e.op("x", "payments.refund", nil), d.fn)
		var le *client.Error
		if !errors.Is(err, client.ErrUnavailable) || !errors.As(err, &le) || le.Reason != "STORE_UNAVAILABLE" || d.calls.Load() != 0 {
			t.Fatalf("Do = %v with fn called %d times; want STORE_UNAVAILABLE and 0", err, d.calls.Load())
		}
	})
}

func TestDoRetriesRetryableFailures(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := newDestination("refuse", "refuse")
		op := e.op("refund", "payments.refund", map[string]any{"amount": 1})
		res, err := e.c.Do(e.ctx, op, d.fn)
		if err != nil || res.Attempt != 3 || res.ResourceID != "R-1" {
			t.Fatalf("Do = %+v, %v", res, err)
		}
		o, _ := e.c.Lookup(e.ctx, op.ID)
		if r := strings.Join(reasons(o), ","); r != "RESERVED,FAILED_RETRYABLE,CLAIMED,FAILED_RETRYABLE,CLAIMED,SUCCEEDED" {
			t.Fatalf("history = %s", r)
		}
		// Out of retries: the tool policy allows 1 retry.
		e.c.SetToolPolicy("create_refund", client.ToolPolicy{Timeout: 10 * time.Second, MaxRetries: 1})
		d2 := newDestination("refuse", "refuse", "refuse")
		op2 := e.op("refund-2", "create_refund", map[string]any{"amount": 1})
		_, err = e.c.Do(e.ctx, op2, d2.fn)
		var ex *client.ExhaustedError
		if !errors.Is(err, client.ErrRetriesExhausted) || !errors.As(err, &ex) || ex.Attempts != 2 || ex.Ambiguous || d2.calls.Load() != 2 {
			t.Fatalf("Do = %v after %d calls", err, d2.calls.Load())
		}
		if o, _ := e.c.Lookup(e.ctx, op2.ID); o.State != client.StatePending {
			t.Fatalf("state = %v, want PENDING (a later call may try again)", o.State)
		}
	})
}

// TestDoFinalFailure: a final failure is recorded with its code, and with
// the message MarkFinalMessage gives (cut to 1 KiB on a rune boundary) or
// the detail MarkFinalDetail gives (cut to 64 KiB); the next Do replays
// them and does not run fn. The error's text never holds the detail.
func TestDoFinalFailure(t *testing.T) {
	long := "card declined: " + strings.Repeat("é", 600)
	detail := "card 4242 declined: " + strings.Repeat("é", 40<<10)
	for _, tc := range []struct{ fault, message, detail string }{
		{"declined", "", ""},
		{"declined-message", long[:1023], ""},
		{"declined-detail", "", detail[:64<<10]},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, e *env) {
				d := newDestination(tc.fault)
				op := e.op("charge", "payments.charge", map[string]any{"amount": 1})
				_, err := e.c.Do(e.ctx, op, d.fn)
				var fe *client.FailedError
				if !errors.Is(err, client.ErrOperationFailed) || !errors.As(err, &fe) || fe.Code != "declined" || fe.Message != tc.message ||
					fe.Detail != tc.detail || fe.Replayed {
					t.Fatalf("Do = %v (detail %d bytes)", err, len(fe.Detail))
				}
				_, err = e.c.Do(e.ctx, op, d.fn)
				if !errors.As(err, &fe) || !fe.Replayed || fe.Code != "declined" || fe.Message != tc.message || fe.Detail != tc.detail ||
					d.calls.Load() != 1 {
					t.Fatalf("replayed Do = %v, detail %d bytes (fn called %d times)", err, len(fe.Detail), d.calls.Load())
				}
				if strings.Contains(err.Error(), "4242") {
					t.Errorf("the error's text holds the detail: %v", err)
				}
			})
		})
	}
}

func TestDoRetriesAmbiguousIdempotentTools(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := newDestination("timeout-after-write")
		op := e.op("sync", "idempotent.sync", map[string]any{"profile": "p"})
		res, err := e.c.Do(e.ctx, op, d.fn)
		if err != nil || res.Attempt != 2 {
			t.Fatalf("Do = %+v, %v", res, err)
		}
		// Applied twice, which an idempotent destination absorbs; the ledger
		// records the second attempt's result.
		if d.count(op.ID) != 2 {
			t.Fatalf("applied %d times", d.count(op.ID))
		}
	})
}

func TestDoWaitsForAnotherHolder(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		op := e.op("slow", "payments.refund", map[string]any{"amount": 1})
		release := make(chan struct{})
		var calls atomic.Int32
		slow := func(ctx context.Context, a client.Attempt) (client.Result, error) {
			calls.Add(1)
			<-release
			return client.Result{ResourceID: "R-slow"}, nil
		}
		first := make(chan error, 1)
		go func() { _, err := e.c.Do(e.ctx, op, slow); first <- err }()
		for calls.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		// The second caller's client tells when the ledger has answered it
		// IN_PROGRESS: it is then waiting for the first.
		see, waiting := ledgertest.SeeInProgress()
		seeWait := client.WithDialOptions(grpc.WithChainUnaryInterceptor(see))
		c2, err := client.Dial(e.stack.Addr, fast, seeWait)
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		second := make(chan client.Result, 1)
		go func() {
			r, err := c2.Do(e.ctx, op, slow)
			if err != nil {
				t.Error(err)
			}
			second <- r
		}()
		<-waiting
		close(release)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if r := <-second; r.ResourceID != "R-slow" || !r.Replayed || calls.Load() != 1 {
			t.Fatalf("waiting caller got %+v; fn called %d times", r, calls.Load())
		}
	})
}

// renewedLease is the lease of the "renewed.*" tools in ledgertest.Policy.
const renewedLease = 4 * time.Second

// A tool that runs for several leases keeps its claim: Do renews the lease
// in the background, and the result is recorded under the first attempt.
// The tool runs until the ledger shows that the claim was renewed three
// times after its first lease ended (each such renewal is accepted only on
// a live claim), however long that takes on a busy machine.
func TestDoRenewsTheLeaseOfLongTools(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// The attempt's own timeout is not what this is about.
		e.c.SetToolPolicy("renewed.export", client.ToolPolicy{Timeout: 2 * time.Minute})
		op := e.op("long", "renewed.export", nil)
		var runs atomic.Int32
		res, err := e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
			runs.Add(1)
			if err := awaitRenewalsPastFirstLease(ctx, e.c, a, renewedLease, 3); err != nil {
				return client.Result{}, err
			}
			return client.Result{ResourceID: "done"}, nil
		})
		if err != nil || res.Attempt != 1 || res.ResourceID != "done" || runs.Load() != 1 {
			t.Fatalf("Do = %+v, %v; the tool ran %d times", res, err, runs.Load())
		}
		o, err := e.c.Lookup(e.ctx, op.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r := strings.Join(reasons(o), ","); r != "RESERVED,SUCCEEDED" {
			t.Fatalf("history = %s: the claim was lost", r)
		}
	})
}

// awaitRenewalsPastFirstLease returns once Lookup has shown n distinct lease
// ends of attempt a's claim that only a renewal made after the claim's
// first lease ended can set (later than that end plus one lease), all with
// the claim still RUNNING under a. It returns an error when the claim is
// lost, ctx ends, or a generous deadline passes first.
func awaitRenewalsPastFirstLease(ctx context.Context, c *client.Client, a client.Attempt, lease time.Duration, n int) error {
	giveUp := time.After(time.Minute)
	seen := map[time.Time]bool{}
	var firstEnd time.Time
	for {
		o, err := c.Lookup(ctx, a.OperationID)
		if err != nil {
			return fmt.Errorf("lookup: %w", err)
		}
		if o.State != client.StateRunning || o.Attempt != a.Number || o.FencingToken != a.FencingToken {
			return fmt.Errorf("the claim was lost: %v, attempt %d, history %s", o.State, o.Attempt, strings.Join(reasons(o), ","))
		}
		if firstEnd.IsZero() {
			if len(o.History) == 0 || o.History[0].Reason != "RESERVED" {
				return fmt.Errorf("no RESERVED entry in the history: %+v", o.History)
			}
			firstEnd = o.History[0].Time.Add(lease)
		}
		if o.LeaseExpiresAt.After(firstEnd.Add(lease)) {
			seen[o.LeaseExpiresAt] = true
		}
		if len(seen) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %d renewals past the first lease: %w", len(seen), context.Cause(ctx))
		case <-giveUp:
			return fmt.Errorf("gave up waiting: %d of %d renewals past the first lease seen", len(seen), n)
		case <-time.After(lease / 20):
		}
	}
}

func TestDoGivesEachAttemptAFreshTimeout(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		e.c.SetToolPolicy("search_orders", client.ToolPolicy{Timeout: 50 * time.Millisecond, MaxRetries: 2, Effect: client.EffectReadOnly})
		var deadlines []time.Time
		_, err := e.c.Do(e.ctx, e.op("search", "search_orders", map[string]any{"q": "x"}), func(ctx context.Context, a client.Attempt) (client.Result, error) {
			dl, ok := ctx.Deadline()
			if !ok {
				t.Error("no per-attempt deadline")
			}
			deadlines = append(deadlines, dl)
			<-ctx.Done()
			return client.Result{}, ctx.Err()
		})
		if !errors.Is(err, client.ErrRetriesExhausted) || len(deadlines) != 3 {
			t.Fatalf("Do = %v after %d attempts", err, len(deadlines))
		}
		for i := 1; i < len(deadlines); i++ {
			if !deadlines[i].After(deadlines[i-1]) {
				t.Fatalf("attempt %d reused the deadline of attempt %d", i+1, i)
			}
		}
	})
}

func TestDoMarksAPanickingToolUnknown(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	op := e.op("panic", "payments.refund", nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic was swallowed")
			}
		}()
		_, _ = e.c.Do(e.ctx, op, func(context.Context, client.Attempt) (client.Result, error) { panic("boom") })
	}()
	if o, _ := e.c.Lookup(e.ctx, op.ID); o.State != client.StateUnknown {
		t.Fatalf("state after a panic = %v, want UNKNOWN", o.State)
	}
}

func TestDoReconcilesTheLastAmbiguousAttempt(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		e.c.SetToolPolicy("create_refund", client.ToolPolicy{Timeout: time.Second, MaxRetries: 0})
		// The only attempt applied the effect and lost the response: asking
		// the destination finds it, though no attempt is left.
		found := newDestination("timeout-after-write")
		e.c.RegisterReconciler("create_refund", found.reconciler)
		res, err := e.c.Do(e.ctx, e.op("found", "create_refund", map[string]any{"amount": 1}), found.fn)
		if err != nil || res.ResourceID != "R-1" || found.calls.Load() != 1 {
			t.Fatalf("Do = %+v, %v (fn called %d times)", res, err, found.calls.Load())
		}
		// It did not: the call ends exhausted, and the operation is PENDING,
		// proven not applied.
		missing := newDestination("timeout-no-write")
		e.c.RegisterReconciler("create_refund", missing.reconciler)
		op := e.op("missing", "create_refund", map[string]any{"amount": 1})
		_, err = e.c.Do(e.ctx, op, missing.fn)
		var ex *client.ExhaustedError
		if !errors.As(err, &ex) || ex.Ambiguous || errors.Is(err, client.ErrNeedsReconciliation) || missing.calls.Load() != 1 {
			t.Fatalf("Do = %v (fn called %d times)", err, missing.calls.Load())
		}
		if o, _ := e.c.Lookup(e.ctx, op.ID); o.State != client.StatePending {
			t.Fatalf("state = %v", o.State)
		}
	})
}

func TestDoRefusesParamsTheWireWouldRound(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination()
	_, err := e.c.Do(e.ctx, e.op("big", "payments.refund", map[string]any{"amount": int64(1<<53 + 1)}), d.fn)
	if !errors.Is(err, client.ErrInvalidArgument) || d.calls.Load() != 0 {
		t.Fatalf("Do = %v (fn called %d times), want ErrInvalidArgument", err, d.calls.Load())
	}
}

// TestRequestsTheWireCannotCarry: a string that is not UTF-8 (an id, a
// tool, a note) is refused as INVALID_ARGUMENT, as the ledger refuses one it
// receives, not as gRPC's INTERNAL, which callers retry; Do never runs fn.
func TestRequestsTheWireCannotCarry(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination()
	good := e.op("good", "payments.refund", map[string]any{"amount": 5})
	if _, err := e.c.Do(e.ctx, good, d.fn); err != nil {
		t.Fatal(err)
	}
	bad := "caf\xe9"
	with := func(f func(*client.Op)) client.Op {
		op := e.op("latin1", "payments.refund", map[string]any{"amount": 5})
		f(&op)
		return op
	}
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Do, the id", func() error { _, err := e.c.Do(e.ctx, with(func(o *client.Op) { o.ID += bad }), d.fn); return err }},
		{"Do, the tool", func() error { _, err := e.c.Do(e.ctx, with(func(o *client.Op) { o.Tool = bad }), d.fn); return err }},
		{"Do, the permit", func() error { _, err := e.c.Do(e.ctx, with(func(o *client.Op) { o.PermitID = bad }), d.fn); return err }},
		{"Do, the run", func() error { _, err := e.c.Do(e.ctx, with(func(o *client.Op) { o.RunID = bad }), d.fn); return err }},
		{"Lookup", func() error { _, err := e.c.Lookup(e.ctx, bad); return err }},
		{"Reconcile, the note", func() error {
			_, err := e.c.Reconcile(e.ctx, good.ID, client.Finding{Kind: client.Escalate, Note: bad})
			return err
		}},
		{"Reconcile, a failure's detail", func() error {
			_, err := e.c.Reconcile(e.ctx, good.ID, client.Finding{Kind: client.Abandon, Failure: &client.Failure{Code: "c", Detail: bad}})
			return err
		}},
		{"StartRun", func() error { _, err := e.c.StartRun(e.ctx, bad, client.RunLimits{}); return err }},
	} {
		err := c.call()
		var le *client.Error
		if !errors.Is(err, client.ErrInvalidArgument) || !errors.As(err, &le) || le.Code != codes.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", c.name, err)
		}
	}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("fn ran %d times, want once (the good operation)", n)
	}
	if o, err := e.c.Lookup(e.ctx, good.ID); err != nil || o.State != client.StateSucceeded || len(o.History) != 2 {
		t.Errorf("the good operation: %+v, %v; want it SUCCEEDED, untouched by the refused Reconcile", o, err)
	}
}

func TestDoRecordsResultDataOfAnyJSONShape(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	type slot struct {
		Start string `json:"start"`
	}
	op := e.op("shapes", "calendar.book", nil)
	_, err := e.c.Do(e.ctx, op, func(context.Context, client.Attempt) (client.Result, error) {
		return client.Result{ResourceID: "a-1", Data: map[string]any{"tags": []string{"x", "y"}, "meta": map[string]string{"k": "v"}, "slot": slot{"09:30"}}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	o, _ := e.c.Lookup(e.ctx, op.ID)
	if o.State != client.StateSucceeded || o.Result.Data["slot"].(map[string]any)["start"] != "09:30" || len(o.Result.Data["tags"].([]any)) != 2 {
		t.Fatalf("recorded %+v", o.Result)
	}
	// Data with no JSON form: the effect happened, so the operation is left
	// to reconciliation instead of recording something fn did not return.
	op2 := e.op("chan", "calendar.book", nil)
	res, err := e.c.Do(e.ctx, op2, func(context.Context, client.Attempt) (client.Result, error) {
		return client.Result{ResourceID: "a-2", Data: map[string]any{"c": make(chan int)}}, nil
	})
	if !errors.Is(err, client.ErrCompletionNotRecorded) || res.ResourceID != "a-2" {
		t.Fatalf("Do = %+v, %v", res, err)
	}
	if o, _ := e.c.Lookup(e.ctx, op2.ID); o.State != client.StateUnknown {
		t.Fatalf("state = %v, want UNKNOWN", o.State)
	}
}

func TestAPIKeys(t *testing.T) {
	key, hash, err := server.NewAPIKey("acme-agent")
	if err != nil {
		t.Fatal(err)
	}
	creds, err := server.ParseCredentials([]byte("keys:\n  - {id: acme-agent, tenant: acme, scopes: [agent], secret_sha256: " + hash + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	st := servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{Credentials: creds})
	d := newDestination()
	op := client.Op{ID: "keys-" + client.NewHolder(), Tool: "payments.refund", PermitID: "p"}
	anon, err := client.Dial(st.Addr, fast)
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Do(context.Background(), op, d.fn); !errors.Is(err, client.ErrUnauthenticated) || d.calls.Load() != 0 {
		t.Fatalf("Do without a key = %v (fn called %d times)", err, d.calls.Load())
	}
	c, err := client.Dial(st.Addr, fast, client.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Do(context.Background(), op, d.fn); err != nil || d.calls.Load() != 1 {
		t.Fatalf("Do with the key = %v", err)
	}
	if _, err := c.Reconcile(context.Background(), op.ID, client.Finding{Kind: client.Applied}); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("Reconcile with an agent key = %v", err)
	}
	who, err := c.Caller(context.Background())
	if err != nil || who.Tenant != "acme" || who.Principal != "acme-agent" || !slices.Equal(who.Scopes, []string{"agent"}) {
		t.Fatalf("Caller = %+v, %v; want acme, acme-agent, [agent]", who, err)
	}
	if who, err := anon.Caller(context.Background()); !errors.Is(err, client.ErrUnauthenticated) {
		t.Fatalf("Caller without a key = %+v, %v", who, err)
	}
}

// TestAPIKeysOnASharedConnection: Clients made by New on one connection,
// each WithAPIKey of its own tenant, act as their own tenant: the same
// operation id runs once in each, and a Client without a key is refused.
func TestAPIKeysOnASharedConnection(t *testing.T) {
	var lines []string
	keys := map[string]string{}
	for _, tenant := range []string{"acme", "globex"} {
		key, hash, err := server.NewAPIKey(tenant + "-agent")
		if err != nil {
			t.Fatal(err)
		}
		keys[tenant] = key
		lines = append(lines, "  - {id: "+tenant+"-agent, tenant: "+tenant+", scopes: [agent], secret_sha256: "+hash+"}")
	}
	creds, err := server.ParseCredentials([]byte("keys:\n" + strings.Join(lines, "\n") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	st := servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{Credentials: creds})
	conn, err := grpc.NewClient(st.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	op := client.Op{ID: "shared-" + client.NewHolder(), Tool: "payments.refund", PermitID: "p"}
	d := newDestination()
	for _, tenant := range []string{"acme", "globex", "acme"} {
		if _, err := client.New(conn, fast, client.WithAPIKey(keys[tenant])).Do(context.Background(), op, d.fn); err != nil {
			t.Fatalf("%s: Do = %v", tenant, err)
		}
	}
	if n := d.count(op.ID); n != 2 {
		t.Fatalf("the effect was applied %d times, want once per tenant", n)
	}
	if _, err := client.New(conn, fast).Do(context.Background(), op, d.fn); !errors.Is(err, client.ErrUnauthenticated) || d.count(op.ID) != 2 {
		t.Fatalf("Do without a key on the shared connection = %v", err)
	}
}

// TestAPIKeyOverAUnixSocket: a Unix socket never leaves this machine, so
// Dial sends an API key over one without TLS, as it does to a loopback
// address: to "unix:PATH" and to "unix-abstract:NAME" the key authenticates
// and Do runs the effect once (once in all: the second Do is a replay).
// Without a key the same socket answers UNAUTHENTICATED, so the key is what
// lets the call in.
func TestAPIKeyOverAUnixSocket(t *testing.T) {
	key, hash, err := server.NewAPIKey("unix-agent")
	if err != nil {
		t.Fatal(err)
	}
	creds, err := server.ParseCredentials([]byte("keys:\n  - {id: unix-agent, tenant: acme, scopes: [agent], secret_sha256: " + hash + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	st := servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{Credentials: creds})
	path := filepath.Join(t.TempDir(), "ledger.sock")
	abstract := "ledger-client-test-" + client.NewHolder()
	for _, l := range []struct{ network, addr string }{{"unix", path}, {"unix", "@" + abstract}} {
		lis, err := net.Listen(l.network, l.addr)
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = st.Service.Serve(lis) }()
	}
	for _, target := range []string{"unix:" + path, "unix://" + path, "unix-abstract:" + abstract} {
		anon, err := client.Dial(target, fast)
		if err != nil {
			t.Fatalf("Dial(%q) without a key: %v", target, err)
		}
		d := newDestination()
		op := client.Op{ID: "unix-" + client.NewHolder(), Tool: "payments.refund", PermitID: "p"}
		if _, err := anon.Do(context.Background(), op, d.fn); !errors.Is(err, client.ErrUnauthenticated) || d.calls.Load() != 0 {
			t.Errorf("%s: Do without a key = %v (fn called %d times), want UNAUTHENTICATED", target, err, d.calls.Load())
		}
		_ = anon.Close()
		c, err := client.Dial(target, fast, client.WithAPIKey(key))
		if err != nil {
			t.Fatalf("Dial(%q) with a key and no TLS = %v, want a client: a Unix socket is this machine", target, err)
		}
		for range 2 {
			if _, err := c.Do(context.Background(), op, d.fn); err != nil {
				t.Errorf("%s: Do with the key = %v", target, err)
			}
		}
		if n := d.count(op.ID); n != 1 || d.calls.Load() != 1 {
			t.Errorf("%s: the effect was applied %d times (fn called %d times), want once", target, n, d.calls.Load())
		}
		_ = c.Close()
	}
}

// TestDoCompensation: a refund that compensates a charge runs once however
// often Do is called, both records name each other, and a refund of a
// charge that failed is refused before the tool runs.
func TestDoCompensation(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		charges, refunds := newDestination(), newDestination()
		charge := e.op("charge", "payments.charge", map[string]any{"amount": 5})
		if _, err := e.c.Do(e.ctx, charge, charges.fn); err != nil {
			t.Fatal(err)
		}
		refund := e.op("refund", "payments.refund", map[string]any{"amount": 5})
		refund.Compensates = charge.ID
		for range 3 {
			if _, err := e.c.Do(e.ctx, refund, refunds.fn); err != nil {
				t.Fatal(err)
			}
		}
		if n := refunds.totalApplied(); n != 1 {
			t.Fatalf("the refund applied %d times, want 1", n)
		}
		c, err := e.c.Lookup(e.ctx, charge.ID)
		if err != nil || !slices.Equal(c.CompensatedBy, []string{refund.ID}) {
			t.Fatalf("the charge: compensated by %v, %v", c.CompensatedBy, err)
		}
		if r, err := e.c.Lookup(e.ctx, refund.ID); err != nil || r.Compensates != charge.ID {
			t.Fatalf("the refund: compensates %q, %v", r.Compensates, err)
		}

		declined := e.op("declined", "payments.charge", map[string]any{"amount": 6})
		if _, err := e.c.Do(e.ctx, declined, newDestination("declined").fn); !errors.Is(err, client.ErrOperationFailed) {
			t.Fatalf("the declined charge: %v", err)
		}
		undo := e.op("undo-declined", "payments.refund", map[string]any{"amount": 6})
		undo.Compensates = declined.ID
		_, err = e.c.Do(e.ctx, undo, refunds.fn)
		var ce *client.Error
		if !errors.Is(err, client.ErrNotCompensable) || !errors.As(err, &ce) || ce.Metadata["cause"] != "not_succeeded" {
			t.Fatalf("a refund of a declined charge: %v", err)
		}
		if n := refunds.totalApplied(); n != 1 {
			t.Fatalf("the refunds applied %d times, want 1", n)
		}
	})
}

// TestReceipts: with a ledger that signs receipts, Do's result carries the
// receipt of the recorded outcome, fresh or replayed, and Lookup's record
// carries one too; each verifies with the ledger's key set and names the
// operation.
func TestReceipts(t *testing.T) {
	key, err := receipt.NewKey("k-client")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := receipt.NewSigner("ledgerd-client-test", []*receipt.Key{key})
	if err != nil {
		t.Fatal(err)
	}
	st := servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{Policy: ledgertest.Policy, Receipts: signer})
	c, err := client.Dial(st.Addr, fast)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, d := context.Background(), newDestination()
	op := client.Op{ID: "receipts-" + client.NewHolder()[2:10], Tool: "payments.refund", Params: map[string]any{"amount": 3}}
	check := func(what, jws string) {
		t.Helper()
		claims, err := receipt.Verify(jws, signer.JWKS())
		if err != nil || claims.OperationID != op.ID || claims.State != "STATE_SUCCEEDED" {
			t.Fatalf("%s: %+v, %v", what, claims, err)
		}
	}
	fresh, err := c.Do(ctx, op, d.fn)
	if err != nil {
		t.Fatal(err)
	}
	check("a fresh result", fresh.Receipt)
	again, err := c.Do(ctx, op, d.fn)
	if err != nil || !again.Replayed {
		t.Fatalf("the replay: %+v, %v", again, err)
	}
	check("a replayed result", again.Receipt)
	rec, err := c.Lookup(ctx, op.ID)
	if err != nil {
		t.Fatal(err)
	}
	check("Lookup", rec.Receipt)
	if d.totalApplied() != 1 {
		t.Fatalf("the refund applied %d times", d.totalApplied())
	}
}
