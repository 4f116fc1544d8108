package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/opledger/ledger/client"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
)

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
	other.RegisterReconciler("short.pay", d.reconciler)
	op := e.op("pay", "short.pay", map[string]any{"amount": 5}) // irreversible, 200ms lease

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
