package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// While a worker's fn is still finishing, its lease ends (no renewal gets
// through), a reconciler finds nothing at the destination yet and records
// NOT_APPLIED, and another caller runs the operation again. Then the
// worker's effect lands: the destination applied it twice, and the ledger
// records the other attempt's outcome. Do must not call that "not recorded,
// reconciles as applied": it returns fn's result with a
// *ConflictingOutcomeError that shows the record that stands and asks for a
// human (ErrNeedsReconciliation), never ErrCompletionNotRecorded.
func TestDoSaysWhenTheLedgerRecordsAnotherOutcomeThanTheEffect(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t), ledgerFault("Renew", "unavailable"))
	other, err := client.Dial(e.stack.Addr, fast)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	d := newDestination()
	op := e.op("refund", "expiring.refund", map[string]any{"amount": 1})
	op.Effect = client.EffectIrreversible
	bg := context.Background()

	res, err := e.c.Do(bg, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		// The lease ends; the ledger's sweep turns the operation UNKNOWN.
		for stop := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if o, err := other.Lookup(bg, op.ID); err == nil && o.State == client.StateUnknown {
				break
			}
			if time.Now().After(stop) {
				t.Error("the operation never became UNKNOWN")
				return client.Result{}, client.MarkRetryable(errors.New("test setup"))
			}
		}
		if _, err := other.Reconcile(bg, op.ID, client.Finding{Kind: client.NotApplied, FencingToken: a.FencingToken, Note: "not found"}); err != nil {
			t.Errorf("Reconcile(not applied): %v", err)
		}
		if r, err := other.Do(bg, op, d.fn); err != nil || r.Replayed {
			t.Errorf("the other caller's Do = %+v, %v; want a new attempt", r, err)
		}
		return d.fn(ctx, a) // this attempt's effect lands now
	})
	if n := d.count(op.ID); n != 2 {
		t.Fatalf("the destination applied the effect %d times, want 2 (the case to report)", n)
	}
	var ce *client.ConflictingOutcomeError
	if !errors.As(err, &ce) || !errors.Is(err, client.ErrConflictingOutcome) || !errors.Is(err, client.ErrNeedsReconciliation) {
		t.Fatalf("Do = %+v, %v; want a *ConflictingOutcomeError", res, err)
	}
	if errors.Is(err, client.ErrCompletionNotRecorded) {
		t.Fatalf("Do: %v matches ErrCompletionNotRecorded, which says the effect will be reconciled as applied", err)
	}
	if res.ResourceID != "R-2" || res.Replayed {
		t.Fatalf("Do's result = %+v; want fn's (R-2)", res)
	}
	if o := ce.Operation; o == nil || o.State != client.StateSucceeded || o.Attempt != 2 || o.Result == nil || o.Result.ResourceID != "R-1" {
		t.Fatalf("the record that stands = %+v; want the other attempt's SUCCEEDED (R-1)", o)
	}
	if c := client.ClassOf(err); c == client.Retryable {
		t.Fatalf("ClassOf = %v", c)
	}
}

// TestDoBacksOffWhenTheTenantIsOverItsRate (contract.md §5: RESOURCE_EXHAUSTED,
// "back off"): against a ledger that lets the tenant make one call at once,
// Do's Complete and the next Do's Reserve are refused RATE_LIMITED with
// RetryInfo; Do waits and repeats the same call instead of failing, so the
// outcome is recorded, the tool runs once, and the second Do replays it
// (fn does not run again).
func TestDoBacksOffWhenTheTenantIsOverItsRate(t *testing.T) {
	st := servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{Policy: ledgertest.Policy, Rate: 4, Burst: 1})
	var limited atomic.Int32
	count := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if status.Code(err) == codes.ResourceExhausted {
			limited.Add(1)
		}
		return err
	})
	c, err := client.Dial(st.Addr, fast, client.WithDialOptions(count))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	op := client.Op{ID: "rate-" + client.NewHolder()[2:10], Tool: "payments.refund", Params: map[string]any{"amount": 10}, PermitID: "permit-1"}
	fn, applied := countingTool()
	for i := range 2 {
		res, err := c.Do(context.Background(), op, fn)
		if err != nil || res.ResourceID != "re_1" {
			t.Fatalf("Do %d = %+v, %v", i+1, res, err)
		}
	}
	if n := applied.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	if limited.Load() == 0 {
		t.Fatal("no call was refused for the rate: the test did not test the backoff")
	}
}

// An attempt's effect lands but its answer is lost (ambiguous): Do marks the
// operation UNKNOWN and asks the reconciler. Meanwhile the worker's late
// Complete records the result the destination gave it (A). The reconciler
// then reports the effect with another result or resource id: the ledger
// answers ALREADY_RESOLVED and keeps A, and Do replays A. When the
// reconciler reports A itself, the ledger answers OK and Do returns A. In
// every case the destination applied the effect once, with a retry after
// the ambiguous attempt and with none (the last attempt settled).
func TestDoReplaysTheRecordedResultWhenTheReconcilerReportsAnother(t *testing.T) {
	for _, c := range []struct {
		name    string
		finding func(rid string) client.Result
	}{
		{"another result", func(rid string) client.Result {
			return client.Result{ResourceID: rid, Data: map[string]any{"receipt": rid, "status": "settled"}}
		}},
		{"another resource id", func(rid string) client.Result {
			return client.Result{ResourceID: rid + "-seen", Data: map[string]any{"receipt": rid}}
		}},
		{"no result", func(string) client.Result { return client.Result{} }},
		{"the same result", func(rid string) client.Result {
			return client.Result{ResourceID: rid, Data: map[string]any{"receipt": rid}}
		}},
	} {
		for _, retries := range []int{1, 0} {
			name := c.name
			if retries == 0 {
				name += ", last attempt"
			}
			t.Run(name, func(t *testing.T) {
				eachBackend(t, func(t *testing.T, e *env) {
					d := newDestination("timeout-after-write")
					op := e.op("refund", "payments.refund", map[string]any{"amount": 1})
					var reconciled int
					e.c.RegisterReconciler(op.Tool, func(ctx context.Context, o *client.Operation) (client.Finding, error) {
						reconciled++
						d.mu.Lock()
						rid := d.applied[o.ID][0]
						d.mu.Unlock()
						// The worker's late report of what the destination
						// answered it.
						a := client.Result{ResourceID: rid, Data: map[string]any{"receipt": rid}}
						if _, err := e.c.Complete(ctx, o.ID, o.FencingToken, a); err != nil {
							t.Errorf("the late Complete: %v", err)
						}
						return client.Finding{Kind: client.Applied, Result: c.finding(rid), Note: "found"}, nil
					})
					pol := client.ToolPolicy{Timeout: 10 * time.Second, MaxRetries: retries, Effect: client.EffectIrreversible}
					e.c.SetToolPolicy(op.Tool, pol)
					res, err := e.c.Do(e.ctx, op, d.fn)
					if n := d.count(op.ID); n != 1 {
						t.Fatalf("the destination applied the effect %d times, want 1", n)
					}
					if err != nil || res.ResourceID != "R-1" || res.Data["receipt"] != "R-1" || len(res.Data) != 1 {
						t.Fatalf("Do = %+v, %v; want the recorded result (R-1)", res, err)
					}
					if reconciled != 1 {
						t.Fatalf("the reconciler ran %d times, want 1", reconciled)
					}
					o, err := e.c.Lookup(e.ctx, op.ID)
					if err != nil {
						t.Fatal(err)
					}
					if o.State != client.StateSucceeded || o.Result == nil || o.Result.ResourceID != "R-1" || len(o.Result.Data) != 1 {
						t.Fatalf("the record = %+v", o)
					}
					for _, h := range o.History {
						if h.Reason == "RECONCILED_APPLIED" {
							t.Fatalf("the reconciler's finding is in the history: %v", reasons(o))
						}
					}
					// The agent retries the whole call: a replay, no effect.
					again, err := e.c.Do(e.ctx, op, d.fn)
					if err != nil || !again.Replayed || again.ResourceID != "R-1" || d.count(op.ID) != 1 {
						t.Fatalf("Do again = %+v, %v, %d effects", again, err, d.count(op.ID))
					}
				})
			})
		}
	}
}

// An op without an id or a tool, or without fn, is refused before the
// Reserve: a claim with no tool to run would be left UNKNOWN, though
// nothing ran.
func TestDoRefusesAnOpItCannotRun(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination()
	for _, c := range []struct {
		name string
		op   func(client.Op) client.Op
		fn   client.Func
	}{
		{"no id", func(o client.Op) client.Op { o.ID = ""; return o }, d.fn},
		{"no tool", func(o client.Op) client.Op { o.Tool = ""; return o }, d.fn},
		{"no fn", func(o client.Op) client.Op { return o }, nil},
	} {
		op := c.op(e.op("refused", "payments.refund", map[string]any{"amount": 5}))
		if _, err := e.c.Do(e.ctx, op, c.fn); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("%s: Do = %v, want ErrInvalidArgument", c.name, err)
		}
	}
	if _, err := e.c.Lookup(e.ctx, e.op("refused", "payments.refund", nil).ID); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Lookup = %v, want ErrNotFound: nothing reserved", err)
	}
	if n := d.calls.Load(); n != 0 {
		t.Errorf("fn ran %d times, want 0", n)
	}
}

// A call timeout or report timeout that is not positive keeps the
// default: with none, every ledger call would fail at once.
func TestDoWithTimeoutsNotPositive(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		e := newEnv(t, redistest.Shared(t).Client(t), client.WithCallTimeout(d), client.WithReportTimeout(d))
		dest := newDestination()
		op := e.op(fmt.Sprintf("timeout-%d", d), "payments.refund", map[string]any{"amount": 5})
		if _, err := e.c.Do(e.ctx, op, dest.fn); err != nil || dest.count(op.ID) != 1 {
			t.Errorf("timeouts %s: Do = %v, %d effects; want one", d, err, dest.count(op.ID))
		}
	}
}

// A Reserve far larger than the ledger accepts is dropped by grpc-go's
// transport with a bare RESOURCE_EXHAUSTED (no ErrorInfo). That is no rate
// limit: Do sends it once, returns ErrMessageTooLarge (neither
// ErrRateLimited nor ErrUnavailable), runs nothing, and leaves no record.
func TestDoDoesNotRetryARequestTooLargeForTheTransport(t *testing.T) {
	var reserves atomic.Int32
	count := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/Reserve") {
			reserves.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
	e := newEnv(t, redistest.Shared(t).Client(t), count)
	op := e.op("huge", "payments.refund", map[string]any{"memo": strings.Repeat("x", 5<<20)})
	var ran atomic.Int32
	_, err := e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		ran.Add(1)
		return client.Result{ResourceID: "re_1"}, nil
	})
	if !errors.Is(err, client.ErrMessageTooLarge) || errors.Is(err, client.ErrRateLimited) || errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Do = %v; want ErrMessageTooLarge only", err)
	}
	if n := reserves.Load(); n != 1 {
		t.Fatalf("the oversized Reserve was sent %d times, want 1", n)
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("fn ran %d times, want 0", n)
	}
	if _, err := e.c.Lookup(context.Background(), op.ID); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Lookup = %v, want ErrNotFound", err)
	}
}

// The caller gives up while its Reserve is in flight, and the ledger's
// answer is EXECUTE: Do must not run the tool on a context that has already
// ended. It returns the claim (the attempt is proven not applied: it never
// ran), so the operation is claimable again, not UNKNOWN awaiting a
// reconciler for an effect that cannot exist.
func TestDoDoesNotRunTheToolAfterTheCallerGaveUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	giveUp := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(c context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(c, method, req, reply, cc, opts...)
		if err == nil && strings.HasSuffix(method, "/Reserve") {
			cancel() // the caller's deadline passes as the answer arrives
		}
		return err
	}))
	e := newEnv(t, redistest.Shared(t).Client(t), giveUp)
	op := e.op("refund", "payments.refund", map[string]any{"amount": 10})
	var applied atomic.Int32
	_, err := e.c.Do(ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		if ctx.Err() != nil {
			return client.Result{}, ctx.Err()
		}
		applied.Add(1)
		return client.Result{ResourceID: "re_1"}, nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want context.Canceled", err)
	}
	o, lerr := e.c.Lookup(context.Background(), op.ID)
	if lerr != nil {
		t.Fatal(lerr)
	}
	if o.State != client.StatePending {
		t.Fatalf("after Do gave up: %v, history %s; want PENDING (claimable, nothing applied)", o.State, strings.Join(reasons(o), ","))
	}
	gaveUpCode(t, o)
	// The next call runs it, once.
	res, err := e.c.Do(context.Background(), op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		applied.Add(1)
		return client.Result{ResourceID: "re_1"}, nil
	})
	if err != nil || res.ResourceID != "re_1" || applied.Load() != 1 {
		t.Fatalf("Do again = %+v, %v; applied %d times, want 1", res, err, applied.Load())
	}
}

// The caller gives up while its Reserve is in flight, and the ledger's
// answer is lost with it: the ledger granted the claim, the caller never
// learned so. Do returns that claim all the same (it looks, finds the
// operation RUNNING, and recovers the claim under the same holder), so the
// operation is claimable again rather than left RUNNING until its lease
// ends and then UNKNOWN, awaiting a reconciler for an attempt that never
// ran. A Reserve that never reached the ledger leaves no record behind.
func TestDoReturnsTheClaimOfAReserveWhoseAnswerWasLostWhenTheCallerGaveUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var gaveUp atomic.Bool
	loseIt := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(c context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(c, method, req, reply, cc, opts...)
		if err == nil && strings.HasSuffix(method, "/Reserve") && !gaveUp.Swap(true) {
			cancel() // the caller gives up as the answer is on its way back
			return context.Canceled
		}
		return err
	}))
	e := newEnv(t, redistest.Shared(t).Client(t), loseIt)
	op := e.op("refund", "payments.refund", map[string]any{"amount": 10})
	fn, applied := countingTool()
	if _, err := e.c.Do(ctx, op, fn); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want context.Canceled", err)
	}
	claimReturned(t, e, op)
	runsOnce(t, e, op, fn, applied)

	// A caller whose context ended before its Reserve went out leaves
	// nothing behind.
	gone := e.op("never-sent", "payments.refund", nil)
	if _, err := e.c.Do(ctx, gone, fn); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with an ended context = %v, want context.Canceled", err)
	}
	if _, err := e.c.Lookup(context.Background(), gone.ID); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Lookup after a Do whose context had ended = %v, want ErrNotFound", err)
	}
}

// Every answer to Do's Reserve is lost (the ledger processed each one; the
// connection dropped on the way back) until the SDK's ledger retries are
// used up: Do returns ErrUnavailable, and fn never ran. The claim the
// ledger granted is returned all the same (Do looks, finds the operation
// RUNNING, and recovers the claim under the same holder), so an
// irreversible operation is claimable again rather than left RUNNING until
// its lease ends and then UNKNOWN, paging someone to reconcile an attempt
// that never ran.
func TestDoReturnsTheClaimOfAReserveWhoseAnswersWereAllLost(t *testing.T) {
	dr, drop := withDropper()
	e := newEnv(t, redistest.Shared(t).Client(t), drop, client.WithLedgerRetries(2))
	op := e.op("refund", "payments.refund", map[string]any{"amount": 10})
	op.Effect = client.EffectIrreversible
	fn, applied := countingTool()
	dr.arm("Reserve", 3) // the first Reserve and its 2 repeats
	if _, err := e.c.Do(context.Background(), op, fn); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Do = %v, want ErrUnavailable", err)
	}
	if n := applied.Load(); n != 0 {
		t.Fatalf("fn ran %d times, want 0", n)
	}
	claimReturned(t, e, op)
	runsOnce(t, e, op, fn, applied)
}

// The answer to Do's Reserve is lost (the ledger processed it), and the
// wait deadline ends the backoff before the Reserve is repeated: Do
// returns a *WaitDeadlineError, fn never ran, and the claim the ledger
// granted is returned rather than left to expire into UNKNOWN.
func TestDoReturnsTheClaimOfALostReserveWhenTheWaitDeadlineEndsTheRepeat(t *testing.T) {
	dr, drop := withDropper()
	slow := client.WithBackoff(client.Backoff{Base: time.Minute, Max: time.Minute}) // the repeat waits past the deadline
	e := newEnv(t, redistest.Shared(t).Client(t), drop, slow)
	op := e.op("refund", "payments.refund", map[string]any{"amount": 10})
	op.Effect = client.EffectIrreversible
	var applied atomic.Int32
	dr.arm("Reserve", 1)
	ctx := client.WithWaitDeadline(context.Background(), time.Now().Add(5*time.Second)) // room for a slow first Reserve on a loaded machine
	_, err := e.c.Do(ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		applied.Add(1)
		return client.Result{ResourceID: "re_1"}, nil
	})
	waitDeadlineError(t, err, client.WaitLedger)
	if n := applied.Load(); n != 0 {
		t.Fatalf("fn ran %d times, want 0", n)
	}
	claimReturned(t, e, op)
}

// countingTool is a tool that makes re_1 and counts its runs.
func countingTool() (client.Func, *atomic.Int32) {
	applied := new(atomic.Int32)
	return func(ctx context.Context, a client.Attempt) (client.Result, error) {
		applied.Add(1)
		return client.Result{ResourceID: "re_1"}, nil
	}, applied
}

// runsOnce fails unless the next Do of op runs fn (which counts its runs in
// applied, and makes re_1) and that makes its only run.
func runsOnce(t *testing.T, e *env, op client.Op, fn client.Func, applied *atomic.Int32) {
	t.Helper()
	if res, err := e.c.Do(context.Background(), op, fn); err != nil || res.ResourceID != "re_1" || applied.Load() != 1 {
		t.Fatalf("Do again = %+v, %v; applied %d times, want 1", res, err, applied.Load())
	}
}

// claimReturned fails unless op's claim was returned unused: PENDING after
// its one attempt, with the failure code caller_gave_up.
func claimReturned(t *testing.T, e *env, op client.Op) {
	t.Helper()
	o, err := e.c.Lookup(context.Background(), op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r := strings.Join(reasons(o), ","); o.State != client.StatePending || r != "RESERVED,FAILED_RETRYABLE" {
		t.Fatalf("after Do: %v, history %s; want the claim returned (PENDING)", o.State, r)
	}
	gaveUpCode(t, o)
}

// gaveUpCode fails unless o's failure says why its claim was returned
// unused: the caller gave up (the code every client uses for it, so an
// operator reading the history can tell it from a tool's retryable error).
func gaveUpCode(t *testing.T, o *client.Operation) {
	t.Helper()
	if o.Failure == nil || o.Failure.Code != "caller_gave_up" {
		t.Fatalf("the returned claim's failure is %+v, want code caller_gave_up", o.Failure)
	}
}

// The answer to Do's Reserve is lost (the ledger granted the claim), and
// the ledger refuses the repeats for the tenant's rate until the SDK's
// ledger retries are used up: Do returns ErrRateLimited, fn never ran, and
// the claim the first Reserve was granted is returned all the same, rather
// than left to expire into UNKNOWN, calling for the reconciliation of an
// attempt that never ran.
func TestDoReturnsTheClaimOfALostReserveWhoseRepeatsWereRefused(t *testing.T) {
	var lost, limited atomic.Int32
	lost.Store(1)
	limited.Store(2) // the 2 repeats
	faults := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(c context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !strings.HasSuffix(method, "/Reserve") {
			return invoker(c, method, req, reply, cc, opts...)
		}
		if lost.Add(-1) >= 0 {
			_ = invoker(c, method, req, reply, cc, opts...)
			return status.Error(codes.Unavailable, "response lost")
		}
		if limited.Add(-1) >= 0 {
			st, _ := status.New(codes.ResourceExhausted, "over the rate").WithDetails(
				&errdetails.ErrorInfo{Reason: "RATE_LIMITED", Domain: "ledger.v1"},
				&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Millisecond)})
			return st.Err()
		}
		return invoker(c, method, req, reply, cc, opts...)
	}))
	e := newEnv(t, redistest.Shared(t).Client(t), faults, client.WithLedgerRetries(2))
	op := e.op("refund", "payments.refund", map[string]any{"amount": 10})
	op.Effect = client.EffectIrreversible
	fn, applied := countingTool()
	if _, err := e.c.Do(context.Background(), op, fn); !errors.Is(err, client.ErrRateLimited) {
		t.Fatalf("Do = %v, want ErrRateLimited", err)
	}
	if n := applied.Load(); n != 0 {
		t.Fatalf("fn ran %d times, want 0", n)
	}
	claimReturned(t, e, op)
	runsOnce(t, e, op, fn, applied)
}

// receipts is a destination that applies every request it gets (it honours
// no idempotency key) and remembers the operation ids it applied.
type receipts struct {
	mu      sync.Mutex
	applied []string
}

func (r *receipts) apply(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = append(r.applied, id)
}

func (r *receipts) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.applied)
}

// reconciler finds an applied operation by its id.
func (r *receipts) reconciler(ctx context.Context, op *client.Operation) (client.Finding, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range r.applied {
		if id == op.ID {
			return client.Finding{Kind: client.Applied, Result: client.Result{ResourceID: "T-1"}, Note: "found"}, nil
		}
	}
	return client.Finding{Kind: client.NotApplied, Note: "not found"}, nil
}

// irreversible is the policy of the destinations' tools: a failure the SDK
// took for proof of "not applied" would run them again.
var irreversible = client.ToolPolicy{Timeout: 5 * time.Second, MaxRetries: 2, Effect: client.EffectIrreversible}

// A gRPC destination applies the effect, then its response is larger than
// the caller accepts: grpc-go fails the call with RESOURCE_EXHAUSTED on the
// caller's side. That is no proof of "not applied": the attempt is
// ambiguous, and the reconciler finds the effect instead of a retry
// applying it again.
func TestDoGRPCResponseTooLargeAfterTheEffectIsAmbiguous(t *testing.T) {
	dest := &receipts{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "tickets.Tickets",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := &wrapperspb.StringValue{}
			if err := dec(in); err != nil {
				return nil, err
			}
			dest.apply(in.GetValue())
			return wrapperspb.String(strings.Repeat("x", 4096)), nil // a large receipt
		}}},
	}, struct{}{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })

	e := newEnv(t, redistest.Shared(t).Client(t))
	e.c.SetToolPolicy("tickets.create", irreversible)
	e.c.RegisterReconciler("tickets.create", dest.reconciler)
	op := e.op("ticket", "tickets.create", map[string]any{"title": "t"})
	res, err := e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		out := &wrapperspb.StringValue{}
		if err := cc.Invoke(ctx, "/tickets.Tickets/Create", wrapperspb.String(a.OperationID), out, grpc.MaxCallRecvMsgSize(1024)); err != nil {
			return client.Result{}, client.ClassifyGRPC(err)
		}
		return client.Result{ResourceID: "T-1"}, nil
	})
	if n := dest.total(); n != 1 {
		t.Fatalf("the destination applied the effect %d times, want 1 (Do = %+v, %v)", n, res, err)
	}
	if err != nil || res.ResourceID != "T-1" || !res.Replayed {
		t.Fatalf("Do = %+v, %v; want the reconciled effect", res, err)
	}
}

// An HTTP destination behind a proxy applies the effect, then resets the
// connection; the proxy answers 503. That is no proof of "not applied"
// either: without a reconciler the operation waits for one, and nothing
// runs again.
func TestDoHTTP503FromAProxyAfterTheEffectIsAmbiguous(t *testing.T) {
	dest := &receipts{}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dest.apply(r.Header.Get("Idempotency-Key"))
		panic(http.ErrAbortHandler) // the connection drops before the response
	}))
	t.Cleanup(upstream.Close)
	target, err := url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		http.Error(w, "upstream connect error or disconnect/reset before headers", http.StatusServiceUnavailable)
	}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)

	e := newEnv(t, redistest.Shared(t).Client(t))
	e.c.SetToolPolicy("tickets.create", irreversible)
	op := e.op("ticket", "tickets.create", map[string]any{"title": "t"})
	_, err = e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/tickets", nil)
		if err != nil {
			return client.Result{}, client.MarkFinal("bad_request", err)
		}
		req.Header.Set("Idempotency-Key", a.IdempotencyKey)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		if err := client.ClassifyHTTP(resp, err); err != nil {
			return client.Result{}, err
		}
		return client.Result{ResourceID: "T-1"}, nil
	})
	if n := dest.total(); n != 1 {
		t.Fatalf("the destination applied the effect %d times, want 1 (Do: %v)", n, err)
	}
	if !errors.Is(err, client.ErrNeedsReconciliation) {
		t.Fatalf("Do: %v; want ErrNeedsReconciliation", err)
	}
}

// ledgerFault makes every call of one ledger method fail the way a ledger
// that does not answer fails (ledgertest.Fault).
func ledgerFault(method, mode string) client.Option {
	return client.WithDialOptions(grpc.WithChainUnaryInterceptor(ledgertest.Fault(method, mode)))
}

// The ledger gives no answer while Do records an ambiguous attempt: however
// the recording fails, and also when the report timeout ends it in the
// middle of a call, Do returns ErrUnavailable (never a bare deadline that
// a caller could take for a settled failure), and fn ran once.
func TestDoLedgerSilentWhileRecordingIsUnavailable(t *testing.T) {
	for _, mode := range []string{"hung", "unavailable", "cut"} {
		t.Run(mode, func(t *testing.T) {
			// The report timeout ends before the first MarkUnknown's call
			// timeout does.
			e := newEnv(t, redistest.Shared(t).Client(t), ledgerFault("MarkUnknown", mode),
				client.WithReportTimeout(200*time.Millisecond), client.WithCallTimeout(time.Minute))
			d := newDestination("timeout-after-write")
			op := e.op("refund", "payments.refund", map[string]any{"amount": 1})
			_, err := e.c.Do(e.ctx, op, d.fn)
			if !errors.Is(err, client.ErrUnavailable) {
				t.Fatalf("Do: %v; want ErrUnavailable", err)
			}
			if n := d.count(op.ID); n != 1 || d.calls.Load() != 1 {
				t.Fatalf("fn ran %d times, applied %d", d.calls.Load(), n)
			}
		})
	}
}

// Complete gets no answer after a success: the result comes back with
// ErrCompletionNotRecorded, which also says the ledger was unavailable.
func TestDoLedgerSilentWhileCompletingIsNotRecorded(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t), ledgerFault("Complete", "hung"),
		client.WithReportTimeout(200*time.Millisecond), client.WithCallTimeout(time.Minute))
	d := newDestination()
	res, err := e.c.Do(e.ctx, e.op("refund", "payments.refund", map[string]any{"amount": 1}), d.fn)
	if !errors.Is(err, client.ErrCompletionNotRecorded) || !errors.Is(err, client.ErrUnavailable) || res.ResourceID != "R-1" {
		t.Fatalf("Do = %+v, %v; want the result with ErrCompletionNotRecorded and ErrUnavailable", res, err)
	}
}

// The ledger refuses a reconciler's finding (here, result data it cannot
// carry): the operation is still unresolved, and Do says so instead of
// returning a bare invalid argument that reads like a malformed request.
func TestDoFindingNotRecordedNeedsReconciliation(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination("timeout-after-write")
	op := e.op("refund", "payments.refund", map[string]any{"amount": 1})
	e.c.RegisterReconciler(op.Tool, func(ctx context.Context, o *client.Operation) (client.Finding, error) {
		return client.Finding{Kind: client.Applied, Result: client.Result{Data: map[string]any{"at": make(chan int)}}}, nil
	})
	_, err := e.c.Do(e.ctx, op, d.fn)
	if !errors.Is(err, client.ErrNeedsReconciliation) {
		t.Fatalf("Do: %v; want ErrNeedsReconciliation", err)
	}
	if d.calls.Load() != 1 {
		t.Fatalf("fn ran %d times", d.calls.Load())
	}
}

// S10 late in the lease: the first Reserve response is lost when a quarter
// of its lease is left, and the retry recovers the same claim (same holder,
// same token) without extending it. Do renews it before that lease ends,
// not a third of a full lease after fn starts, so the claim outlives the
// original lease while fn runs: fn runs until the ledger shows a renewal
// made after the original lease ended.
func TestDoRenewsARecoveredClaimBeforeItsLeaseEnds(t *testing.T) {
	var lost atomic.Bool
	loseLate := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err != nil || !strings.HasSuffix(method, "/Reserve") || lost.Swap(true) {
			return err
		}
		end := reply.(*ledgerv1.ReserveResponse).GetOperation().GetLeaseExpiresAt().AsTime()
		time.Sleep(time.Until(end.Add(-renewedLease / 4))) // a slow network
		return status.Error(codes.Unavailable, "response lost")
	}))
	e := newEnv(t, redistest.Shared(t).Client(t), loseLate)
	e.c.SetToolPolicy("renewed.export", client.ToolPolicy{Timeout: 2 * time.Minute})
	op := e.op("export", "renewed.export", nil)
	var runs atomic.Int32
	res, err := e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		runs.Add(1)
		if err := awaitRenewalsPastFirstLease(ctx, e.c, a, renewedLease, 1); err != nil {
			return client.Result{}, err
		}
		return client.Result{ResourceID: "done"}, nil
	})
	o, lerr := e.c.Lookup(e.ctx, op.ID)
	if lerr != nil {
		t.Fatal(lerr)
	}
	if err != nil || res.Attempt != 1 || res.ResourceID != "done" || runs.Load() != 1 {
		t.Fatalf("Do = %+v, %v; fn ran %d times; history %s", res, err, runs.Load(), strings.Join(reasons(o), ","))
	}
	if r := strings.Join(reasons(o), ","); r != "RESERVED,SUCCEEDED" {
		t.Fatalf("history %s: the recovered claim was lost", r)
	}
}

// The ledger stops answering this worker's renewals (a partition: others
// still reach it). When the claim's lease nears its end without a renewal
// getting through, the claim may soon be someone else's, so Do cancels fn's
// context instead of letting fn run on past its lease, and the attempt is
// marked UNKNOWN (fn was cut, its effect may exist).
func TestDoStopsTheToolWhenItsLeaseEndsUnrenewed(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t), ledgerFault("Renew", "unavailable"))
	op := e.op("export", "leased.export", nil)
	var cause atomic.Value
	_, err := e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		select {
		case <-time.After(20 * time.Second): // far past the 1s lease
			return client.Result{ResourceID: "done"}, nil
		case <-ctx.Done():
			cause.Store(context.Cause(ctx))
			return client.Result{}, ctx.Err()
		}
	})
	c, _ := cause.Load().(error)
	if c == nil || !strings.Contains(c.Error(), "lease") {
		t.Fatalf("Do = %v; fn's context ended with %v, want the lease's end", err, c)
	}
	o, lerr := e.c.Lookup(e.ctx, op.ID)
	if lerr != nil {
		t.Fatal(lerr)
	}
	if o.State != client.StateUnknown {
		t.Fatalf("after the cut attempt: %v, history %s; want UNKNOWN", o.State, strings.Join(reasons(o), ","))
	}
}

// runPastTheLease runs an idempotent operation with a renewedLease lease
// through the worker e.c, whose renewals do not get through. The worker's
// first attempt reads the lease's end from the ledger's record and runs
// until its context ends. It fails the test unless that context ended for
// the lease, at least half of Do's margin (a tenth of the lease) before the
// lease's end on the ledger's record, and with the claim still the
// worker's: another holder's Reserve, sent once the tool has stopped, must
// be told the operation is in progress, not be given it. The worker's Do
// then records the cut attempt, claims the operation again and succeeds.
func runPastTheLease(t *testing.T, e *env) {
	t.Helper()
	other, err := client.Dial(e.stack.Addr, fast)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	op := e.op("sync", "renewed.sync", nil)
	op.Effect = client.EffectIdempotent // claimed again, not reconciled, after the cut attempt

	const margin = renewedLease / 10
	var (
		runs                atomic.Int32
		expiry, ended       time.Time // the lease's end on the record; when fn's context ended
		cause               error
		others              *client.Reservation
		lookErr, reserveErr error
	)
	worker := doAsync(e.ctx, e.c, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		if runs.Add(1) > 1 {
			return client.Result{ResourceID: "again"}, nil
		}
		o, err := e.c.Lookup(e.ctx, a.OperationID)
		if err != nil || o.FencingToken != a.FencingToken {
			lookErr = fmt.Errorf("the record at the attempt's start: %+v, %v", o, err)
			return client.Result{}, lookErr
		}
		expiry = o.LeaseExpiresAt
		<-ctx.Done()
		ended = time.Now()
		cause = context.Cause(ctx)
		others, reserveErr = other.Reserve(e.ctx, op, client.NewHolder())
		return client.Result{}, errors.New("stopped")
	})
	err = returned(t, worker, "for the worker")
	if lookErr != nil {
		t.Fatal(lookErr)
	}
	if cause == nil || !strings.Contains(cause.Error(), "lease") {
		t.Fatalf("fn's context ended with %v, want the lease's end", cause)
	}
	if !ended.Before(expiry.Add(-margin / 2)) {
		t.Fatalf("fn's context ended at %s, %s before the lease's end on the record (%s); want at least %s before",
			ended.Format(time.StampMicro), expiry.Sub(ended), expiry.Format(time.StampMicro), margin/2)
	}
	if reserveErr != nil || others.Decision != client.DecisionInProgress {
		t.Fatalf("another holder's Reserve once the tool stopped = %+v, %v; want IN_PROGRESS (the claim still the worker's)", others, reserveErr)
	}
	if o, lerr := e.c.Lookup(e.ctx, op.ID); err != nil || lerr != nil || o.State != client.StateSucceeded || runs.Load() != 2 {
		t.Fatalf("the worker's Do = %v; fn ran %d times; the record %+v, %v; want SUCCEEDED on the second run", err, runs.Load(), o, lerr)
	}
}

// A renewal the ledger never answers (a hung call, not a refused one) is no
// reason to run on past the lease: with the renewal still unanswered, fn's
// context ends a margin before the lease's end, before another holder can
// claim the operation and run it alongside.
func TestDoStopsTheToolWhenItsRenewalHangsPastTheLease(t *testing.T) {
	// The worker's call timeout is far beyond the lease.
	runPastTheLease(t, newEnv(t, redistest.Shared(t).Client(t), ledgerFault("Renew", "hung"), client.WithCallTimeout(time.Hour)))
}

// The ledger answers a renewal that the claim is gone (NOT_FOUND, as after
// a failover that lost the record): fn's context ends with that cause, not
// the lease's end, and Do reports the operation as needing reconciliation,
// never as applied or not.
func TestDoStopsTheToolWhenItsClaimIsGone(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t), ledgerFault("Renew", "not-found"))
	op := e.op("sync", "renewed.sync", nil)
	var cause error
	worker := doAsync(e.ctx, e.c, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return client.Result{}, ctx.Err()
	})
	err := returned(t, worker, "for the worker")
	if !errors.Is(cause, client.ErrNotFound) {
		t.Fatalf("fn's context ended with %v, want the ledger's NOT_FOUND", cause)
	}
	if !errors.Is(err, client.ErrNeedsReconciliation) {
		t.Fatalf("Do = %v, want ErrNeedsReconciliation", err)
	}
}

// The store's clock is an hour ahead of the worker's: the lease end the
// ledger reports is an hour later on the worker's clock than the lease's
// real end. With no renewal getting through, fn's context still ends a
// margin before the lease does, not an hour later: the worker counts the
// lease from when it asked for the claim, by its own clock.
func TestDoStopsTheToolAtItsLeaseEndWhenTheStoreClockIsAhead(t *testing.T) {
	ahead := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(*ledgerv1.ReserveResponse); ok && err == nil {
			o := r.GetOperation()
			for _, ts := range []*timestamppb.Timestamp{o.GetCreatedAt(), o.GetUpdatedAt(), o.GetLeaseExpiresAt()} {
				if ts != nil {
					ts.Seconds += 3600
				}
			}
		}
		return err
	}))
	runPastTheLease(t, newEnv(t, redistest.Shared(t).Client(t), ahead, ledgerFault("Renew", "unavailable")))
}

// The Reserve answer granting a claim arrives after the claim's lease has
// ended (a slow network): meanwhile another holder reconciled the lapsed
// claim as not applied, claimed the operation and applied the effect. Do
// must not start fn on the lapsed claim: the effect is applied once, and
// the worker's call replays the other holder's result.
func TestDoDoesNotRunTheToolOnAClaimWhoseLeaseEndedOnTheWay(t *testing.T) {
	reserved, taken := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	slow := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if strings.HasSuffix(method, "/Reserve") && !held.Swap(true) {
			close(reserved)
			<-taken // the answer arrives once another holder has run the tool
		}
		return err
	}))
	e := newEnv(t, redistest.Shared(t).Client(t), slow)
	other, err := client.Dial(e.stack.Addr, fast)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	d := newDestination()
	other.RegisterReconciler("expiring.pay", d.reconciler)
	op := e.op("pay", "expiring.pay", map[string]any{"amount": 5}) // irreversible, 200ms lease

	worker := make(chan error, 1)
	var res client.Result
	go func() { var err error; res, err = e.c.Do(e.ctx, op, d.fn); worker <- err }()
	<-reserved
	second, err := other.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		defer close(taken)
		return d.fn(ctx, a)
	})
	if err != nil || second.ResourceID != "R-1" {
		t.Fatalf("the second holder's Do = %+v, %v", second, err)
	}
	if err := returned(t, worker, "for the worker"); err != nil || !res.Replayed || res.ResourceID != "R-1" {
		t.Fatalf("the worker's Do = %+v, %v; want a replay of R-1", res, err)
	}
	if n := d.count(op.ID); n != 1 {
		t.Fatalf("effect applied %d times, want 1: fn ran on a claim whose lease had ended", n)
	}
}

// The Reserve answer granting a claim arrives late (a slow network), with
// less than Do's margin (a tenth of the lease) left before the lease's end
// on the ledger's record: fn would be stopped at once with no renewal
// through, so it does not start on that claim. The claim is returned, and fn
// runs once, on the next attempt.
func TestDoDoesNotRunTheToolOnAClaimThatArrivesWithinItsLeaseMargin(t *testing.T) {
	var held atomic.Bool
	late := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil && strings.HasSuffix(method, "/Reserve") && !held.Swap(true) {
			end := reply.(*ledgerv1.ReserveResponse).GetOperation().GetLeaseExpiresAt().AsTime()
			time.Sleep(time.Until(end.Add(-renewedLease / 20))) // half the margin left
		}
		return err
	}))
	e := newEnv(t, redistest.Shared(t).Client(t), late)
	op := e.op("export", "renewed.export", nil)
	var attempts []uint32
	res, err := e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		attempts = append(attempts, a.Number)
		return client.Result{ResourceID: "done"}, nil
	})
	o, lerr := e.c.Lookup(e.ctx, op.ID)
	if lerr != nil {
		t.Fatal(lerr)
	}
	if err != nil || res.ResourceID != "done" || len(attempts) != 1 || attempts[0] != 2 {
		t.Fatalf("Do = %+v, %v; fn ran on attempts %v, want once, on attempt 2; history %s", res, err, attempts, strings.Join(reasons(o), ","))
	}
}

// The worker's renewals do not get through; its tool is cut at the lease's
// end and then says the request was declined for good. Meanwhile another
// holder reclaimed the idempotent operation and succeeded. The ledger
// refuses the worker's late FAILED_FINAL (its token is stale), so Do does
// not report "failed for good" for an operation that succeeded: it reads
// the ledger's outcome and returns it, replayed.
func TestDoReturnsTheLedgersOutcomeWhenAFinalFailureCameAfterTheClaim(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t), ledgerFault("Renew", "unavailable"))
	other, err := client.Dial(e.stack.Addr, fast)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	op := e.op("sync", "leased.sync", nil)
	op.Effect = client.EffectIdempotent // reclaimed once the lease ends

	var applied atomic.Int32
	started, settled := make(chan struct{}), make(chan struct{})
	worker := make(chan struct {
		res client.Result
		err error
	}, 1)
	go func() {
		res, err := e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
			if a.Number > 1 {
				t.Error("the worker ran the tool again")
			}
			close(started)
			<-ctx.Done() // the lease ended unrenewed
			<-settled    // the destination's answer comes late: declined
			return client.Result{}, client.MarkFinal("DECLINED", errors.New("declined"))
		})
		worker <- struct {
			res client.Result
			err error
		}{res, err}
	}()
	<-started
	if _, err := other.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		applied.Add(1)
		return client.Result{ResourceID: "sync-2"}, nil
	}); err != nil {
		t.Fatalf("the other holder's Do: %v", err)
	}
	close(settled)
	got := <-worker
	if got.err != nil || got.res.ResourceID != "sync-2" || !got.res.Replayed {
		t.Fatalf("the worker's Do = %+v, %v; want the other holder's result, replayed", got.res, got.err)
	}
	if n := applied.Load(); n != 1 {
		t.Fatalf("the effect was applied %d times, want 1", n)
	}
	o, err := e.c.Lookup(e.ctx, op.ID)
	if err != nil || o.State != client.StateSucceeded {
		t.Fatalf("the record: %v, %v; want SUCCEEDED", o, err)
	}
}
