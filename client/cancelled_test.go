package client_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

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
