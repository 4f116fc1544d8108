package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Func runs one attempt of an operation's tool. It gets a context bounded
// by the tool's timeout (canceled too when the claim is lost) and the
// attempt. Its error decides what the ledger records (see ClassOf).
type Func func(ctx context.Context, a Attempt) (Result, error)

// defaultReportTimeout bounds the calls that record an attempt's outcome
// (see WithReportTimeout).
const defaultReportTimeout = 10 * time.Second

// Do performs op through the ledger: it runs fn at most as often as the
// ledger allows, and returns fn's result, or the recorded result of an
// earlier call (Result.Replayed). fn never runs without a claim: when the
// ledger cannot be reached, or ctx or its wait deadline ends first, Do
// returns without running it, and returns a claim it could not use.
//
// An op without ID or Tool, or a nil fn, is ErrInvalidArgument before the
// ledger is asked. Its errors match the sentinels with errors.Is:
// ErrOperationFailed, ErrRetriesExhausted, ErrNeedsReconciliation,
// ErrKeyReused and the other refusals (stop: never retry under a new id),
// ErrUnavailable, ErrCompletionNotRecorded and ErrConflictingOutcome (both
// with fn's result), ErrWaitDeadline and ctx's error. docs/client.md
// ("What Do returns") says what each means and what the caller does.
func (c *Client) Do(ctx context.Context, op Op, fn Func) (Result, error) {
	if op.ID == "" || op.Tool == "" || fn == nil {
		// Refused before the Reserve: a claim without a tool to run would
		// be left UNKNOWN, though nothing ran.
		return Result{}, &Error{Reason: "INVALID_ARGUMENT", Message: "Op.ID, Op.Tool and fn are required", sentinel: ErrInvalidArgument}
	}
	pol := c.toolPolicy(op.Tool)
	if pol.Timeout <= 0 {
		pol.Timeout = DefaultToolPolicy.Timeout
	}
	if op.Effect == EffectUnspecified {
		op.Effect = pol.Effect
	}
	// Waits end at the wait deadline too; fn, ledger calls and reports
	// never get wctx.
	until, bounded := WaitDeadline(ctx)
	wctx, stopWaits := waitContext(ctx, until, bounded)
	defer stopWaits()
	d := &doCall{c: c, ctx: ctx, wctx: wctx, op: op, pol: pol, fn: fn, until: until,
		holder: NewHolder()} // one per call of the operation, reused only by its retries
	for {
		if pastWaitDeadline(ctx) {
			if d.last != nil && (d.last.State == StateSucceeded || d.last.State == StateFailedFinal) {
				// Settled while Do waited (a reconciler's finding): the
				// outcome is known, and a Reserve would only replay it.
				return replay(d.last)
			}
			return Result{}, d.deadline(d.waited, d.last, d.lastErr)
		}
		res, asked, err := d.reserve()
		if err != nil {
			return Result{}, err
		}
		d.last = res.Operation
		var out Result
		done := true
		switch res.Decision {
		case DecisionReplay:
			out, err = replay(res.Operation)
		case DecisionInProgress:
			done, err = d.inProgress(res)
		case DecisionReconcile:
			done, err = d.reconcile(res.Operation)
		case DecisionExecute:
			out, done, err = d.execute(res.Operation, asked)
		default:
			err = fmt.Errorf("client: unexpected decision %v", res.Decision)
		}
		if done {
			return out, err
		}
	}
}

// doCall is one call of Do: what it was given and what it has seen.
type doCall struct {
	c         *Client
	ctx, wctx context.Context
	op        Op
	pol       ToolPolicy
	fn        Func
	holder    string
	until     time.Time // the wait deadline

	failures, waits, reconciles int
	lastErr                     error      // the last attempt's error
	last                        *Operation // the record as last seen
	waited                      Wait       // what Do waited for last
}

func (d *doCall) deadline(w Wait, o *Operation, err error) error {
	return &WaitDeadlineError{Deadline: d.until, Waiting: w, Operation: o, Err: err}
}

// reserve sends the Reserve (repeated while the caller waits), and returns
// when it was asked: no claim it brings began earlier. A claim whose answer
// was lost is returned before reserve fails.
func (d *doCall) reserve() (*Reservation, time.Time, error) {
	var res *Reservation
	asked := time.Now()
	sent := false // a Reserve went out while the caller still waited
	lost := false // one of them got no answer (the last, or an earlier one)
	err := d.c.callWaiting(d.ctx, d.wctx, func(ctx context.Context) (err error) {
		sent = sent || ctx.Err() == nil
		res, err = d.c.Reserve(ctx, d.op, d.holder)
		lost = lost || err != nil && unanswered(err)
		return err
	})
	if err == nil {
		return res, asked, nil
	}
	var cut *waitCutError
	if errors.As(err, &cut) {
		if sent && lost {
			d.c.returnLostClaim(d.ctx, d.op, d.holder)
		}
		return nil, asked, d.deadline(cut.wait, d.last, cut.err)
	}
	if sent && (d.ctx.Err() != nil || lost) {
		// The ledger may have granted a claim whose answer never arrived
		// (even when the repeats were refused, for the tenant's rate say):
		// fn does not run on it, so it is returned.
		d.c.returnLostClaim(d.ctx, d.op, d.holder)
	}
	return nil, asked, err
}

// inProgress waits out another holder's claim; done when Do returns err.
func (d *doCall) inProgress(res *Reservation) (done bool, err error) {
	d.waits++
	d.waited = WaitInProgress
	if err := pause(d.ctx, d.wctx, max(res.RetryAfter, d.c.backoff.Delay(d.waits))); err != nil {
		if err == errWaitDeadline {
			// Someone else holds the claim: its outcome is unknown here,
			// and the record stays theirs.
			return true, d.deadline(WaitInProgress, res.Operation, d.lastErr)
		}
		return true, err
	}
	return false, nil
}

// reconcile asks the tool's reconciler about an UNKNOWN operation; done
// when Do returns err.
func (d *doCall) reconcile(o *Operation) (done bool, err error) {
	if d.reconciles++; d.reconciles > d.pol.MaxRetries+2 {
		return true, &ReconcileError{Operation: o, Err: d.lastErr}
	}
	now, err := d.c.reconcile(d.ctx, d.wctx, d.op.Tool, d.pol, o, d.lastErr)
	if w, ok := waitCut(err); ok {
		return true, d.deadline(w, o, d.lastErr)
	}
	if err != nil {
		return true, err
	}
	if now != nil {
		d.last = now
	}
	d.waited = WaitReconciliation
	return false, nil
}

// execute runs fn on the claim o and records how it ended; done when Do
// returns out and err, else Do reserves again.
func (d *doCall) execute(o *Operation, asked time.Time) (out Result, done bool, err error) {
	if d.ctx.Err() != nil || pastWaitDeadline(d.ctx) {
		// The caller gave up, or its wait deadline passed, while the claim
		// was on its way: fn never runs, so the attempt is proven not
		// applied. Return the claim, rather than leave it to expire into
		// UNKNOWN.
		now, rerr := d.c.reportFailure(d.ctx, o, Retryable, codeCallerGaveUp)
		err := d.ctx.Err()
		if err == nil {
			err = d.deadline(d.waited, cmp.Or(now, o), d.lastErr)
		}
		if rerr != nil {
			return Result{}, true, fmt.Errorf("%w (returning the claim: %w)", err, rerr)
		}
		return Result{}, true, err
	}
	var ferr error
	if stop, ok := stopBy(o, asked); ok && !time.Now().Before(stop) {
		// The answer took longer than the lease (less its margin): the
		// claim may be someone else's already, or fn would be stopped at
		// once. fn does not run on it; the claim is returned as a
		// retryable attempt, proven not applied.
		ferr = MarkRetryable(errLeaseEndedOnTheWay)
	} else {
		if out, ferr = d.c.execute(d.ctx, d.op, d.pol, o, asked, d.fn); ferr == nil {
			out, err = d.c.succeed(d.ctx, o, out)
			return out, true, err
		}
	}
	d.lastErr = ferr
	return d.failed(o, ferr)
}

// failed records the failed attempt o and decides what follows: a final
// failure ends Do, a retryable or ambiguous one waits a backoff and
// reserves again while attempts are left.
func (d *doCall) failed(o *Operation, ferr error) (out Result, done bool, err error) {
	class := ClassOf(ferr)
	if class == Final {
		err := d.c.failFinal(d.ctx, o, ferr)
		if !errors.Is(err, errClaimGone) {
			return Result{}, true, err
		}
		// The claim was gone when its final failure came (its lease ended,
		// and another attempt may have settled the operation since): the
		// ledger's record says how it ended. Reserve again: it replays that
		// outcome, waits for the other attempt, or claims the operation
		// anew.
		return Result{}, false, nil
	}
	now, err := d.c.reportFailure(d.ctx, o, class, "retryable")
	if err != nil {
		return Result{}, true, fmt.Errorf("recording the failed attempt (%v): %w", ferr, err)
	}
	if now != nil {
		d.last = now
	}
	if d.failures++; d.failures > d.pol.MaxRetries {
		if class == Ambiguous && now != nil && now.State == StateUnknown && now.Effect == EffectIrreversible && d.c.reconciler(d.op.Tool) != nil {
			// No attempts are left, but the effect may exist: asking the
			// destination runs nothing again.
			res, err := d.c.settleLast(d.ctx, d.wctx, d.op.Tool, d.pol, now, d.failures, ferr)
			if w, ok := waitCut(err); ok {
				return Result{}, true, d.deadline(w, now, ferr)
			}
			return res, true, err
		}
		return Result{}, true, &ExhaustedError{Attempts: d.failures, Ambiguous: class == Ambiguous, Err: ferr}
	}
	d.waited = WaitBackoff
	if err := pause(d.ctx, d.wctx, d.c.backoff.Delay(d.failures)); err != nil {
		if err == errWaitDeadline {
			return Result{}, true, d.deadline(WaitBackoff, d.last, ferr)
		}
		return Result{}, true, err
	}
	return Result{}, false, nil
}

// execute runs fn once under the claim in o, asked for at asked (this
// process's clock): a fresh timeout, the lease renewed in the background,
// and the attempt canceled if the claim is lost. If fn panics, the attempt
// is marked unknown before the panic goes on.
func (c *Client) execute(ctx context.Context, op Op, pol ToolPolicy, o *Operation, asked time.Time, fn Func) (out Result, err error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	actx, cancelTimeout := context.WithTimeout(actx, pol.Timeout)
	defer cancelTimeout()
	renewing := make(chan struct{})
	go func() { defer close(renewing); c.renew(actx, o, asked, cancel) }()
	defer func() {
		cancelTimeout()
		<-renewing
		if p := recover(); p != nil {
			_ = c.report(ctx, func(ctx context.Context) error {
				_, err := c.MarkUnknown(ctx, o.ID, o.FencingToken, "the tool panicked")
				return err
			})
			panic(p)
		}
	}()
	key := op.IdempotencyKey
	if key == "" {
		key = op.ID
	}
	return fn(actx, Attempt{OperationID: o.ID, IdempotencyKey: key, FencingToken: o.FencingToken, Number: o.Attempt})
}

// renew extends the claim's lease until ctx ends, so that at least two
// thirds of it are always left: first when the lease is down to two
// thirds, which is at once for a claim recovered late in its lease after a
// lost Reserve response, then every third of the lease after each renewal.
// A lost claim cancels the attempt, and so does a lease that nears its end
// while no renewal gets through (the ledger unreachable from here, or a
// renewal still unanswered then, whatever the call timeout): the claim may
// be someone else's once it ends.
//
// The lease ends at the end the ledger reported (o.LeaseExpiresAt, then
// each renewal's), on the store's clock, or a lease after the claim or the
// renewal was asked for (asked, then each Renew's start) on this process's
// clock, whichever comes first: the store's clock may be ahead of this
// one, and the lease never began before it was asked for. The attempt is
// stopped leaseMargin before that end (see stopBy).
func (c *Client) renew(ctx context.Context, o *Operation, asked time.Time, cancel context.CancelCauseFunc) {
	lease := o.lease()
	if lease <= 0 {
		return
	}
	period := max(lease/3, 10*time.Millisecond)
	end, _ := leaseEnd(o, asked)
	stop, _ := stopBy(o, asked)
	t := time.NewTimer(firstRenewal(end, lease))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A renewal still unanswered when the attempt must stop is cut
		// there, and counts as one that did not get through.
		asked := time.Now()
		cctx, done := context.WithTimeout(ctx, min(c.callTimeout, time.Until(stop)))
		now, err := c.Renew(cctx, o.ID, o.FencingToken)
		done()
		switch {
		case err == nil:
			end = asked.Add(lease)
			if now != nil && !now.LeaseExpiresAt.IsZero() {
				end = earliest(now.LeaseExpiresAt, end)
			}
			stop = end.Add(-leaseMargin(lease))
		case errors.Is(err, ErrStaleToken) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrKeyExpired):
			cancel(err)
			return
		case !time.Now().Before(stop):
			cancel(fmt.Errorf("%w: the claim's lease was about to end with no renewal getting through (%w)", errLeaseLapsed, err))
			return
		}
		// After a failed renewal, try again by the time the attempt must
		// stop at the latest.
		t.Reset(min(period, max(time.Until(stop), 0)))
	}
}

// leaseEnd is when the claim in o, asked for at asked, ends at the latest
// (see renew); false when o has no lease.
func leaseEnd(o *Operation, asked time.Time) (time.Time, bool) {
	lease := o.lease()
	if lease <= 0 {
		return time.Time{}, false
	}
	return earliest(o.LeaseExpiresAt, asked.Add(lease)), true
}

// stopBy is when an attempt on the claim in o, asked for at asked, must
// stop unless a renewal gets through: leaseMargin before its lease's end
// (see leaseEnd); false when o has no lease.
func stopBy(o *Operation, asked time.Time) (time.Time, bool) {
	end, ok := leaseEnd(o, asked)
	if !ok {
		return time.Time{}, false
	}
	return end.Add(-leaseMargin(o.lease())), true
}

// leaseMargin is how long before its lease's end, as this process tells
// it, an attempt whose renewals do not get through is stopped: a tenth of
// the lease, at most a second. The ledger lets another holder claim the
// operation once the lease has ended on the store's clock, and this
// process's timer may fire late on a busy machine, and fn takes a moment to
// see its context end: stopping it early keeps it from running on a claim
// that is someone else's.
func leaseMargin(lease time.Duration) time.Duration {
	return min(lease/10, time.Second)
}

// LeaseMargin is how long before the end of its lease, of length lease, Do
// stops an attempt whose renewals do not get through, and within how much
// of that end a Reserve answer does not start the tool: a tenth of the
// lease, at most a second. The clients in examples/ use the same margin.
func LeaseMargin(lease time.Duration) time.Duration {
	return leaseMargin(lease)
}

// errLeaseEndedOnTheWay is the error of an attempt whose claim's lease
// ended (or came within leaseMargin of its end) before the Reserve answer
// granting it arrived: fn did not run.
var errLeaseEndedOnTheWay = errors.New("client: the claim's lease ended, or was about to, before the answer granting it arrived; the tool did not run")

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// errLeaseLapsed is the cause of an attempt cut because its lease was
// about to end (see leaseMargin) while the ledger could not be reached to
// renew it.
var errLeaseLapsed = errors.New("client: attempt stopped at the end of its lease")

// firstRenewal is how long after now a claim whose lease of length lease
// ends at end is first renewed: when two thirds of the lease are left, and
// never later than a third of the lease (when the store's clock is ahead).
func firstRenewal(end time.Time, lease time.Duration) time.Duration {
	return min(max(time.Until(end)-lease*2/3, 0), max(lease/3, 10*time.Millisecond))
}

// succeed records fn's result. The ledger's record wins over fn's result
// when a reconciler recorded the effect first. A report the ledger refuses
// because it holds another outcome returns a *ConflictingOutcomeError; one
// it does not record otherwise, a *NotRecordedError.
func (c *Client) succeed(ctx context.Context, o *Operation, out Result) (Result, error) {
	out.Attempt, out.Replayed = o.Attempt, false
	if _, err := resultToProto(out); err != nil {
		// The effect happened but its result cannot be sent: leave it to
		// reconciliation rather than record a result that is not fn's.
		_ = c.report(ctx, func(ctx context.Context) error {
			_, err := c.MarkUnknown(ctx, o.ID, o.FencingToken, "result data cannot be encoded")
			return err
		})
		return out, &NotRecordedError{Err: fmt.Errorf("result data: %w", err)}
	}
	var done *Operation
	err := c.report(ctx, func(ctx context.Context) (err error) {
		done, err = c.Complete(ctx, o.ID, o.FencingToken, out)
		return err
	})
	if errors.Is(err, ErrStaleToken) || errors.Is(err, ErrCompletionConflict) {
		// The ledger holds another outcome: it will not reconcile this
		// effect as applied. Read what stands, for whoever must sort it out.
		var now *Operation
		_ = c.report(ctx, func(ctx context.Context) (err error) {
			now, err = c.Lookup(ctx, o.ID)
			return err
		})
		return out, &ConflictingOutcomeError{Operation: now, Attempt: o.Attempt, Err: err}
	}
	if errors.Is(err, ErrInvalidArgument) {
		// The ledger refused the result data (over its size limit): it will
		// not take it on a repeat either. Leave the effect to
		// reconciliation now, rather than when the lease ends.
		_ = c.report(ctx, func(ctx context.Context) error {
			_, err := c.MarkUnknown(ctx, o.ID, o.FencingToken, "result data refused by the ledger")
			return err
		})
	}
	if err != nil {
		return out, &NotRecordedError{Err: err}
	}
	if done != nil && done.Result != nil && done.Attempt == o.Attempt {
		rec := *done.Result
		rec.Attempt, rec.Receipt = o.Attempt, done.Receipt
		return rec, nil
	}
	if done != nil && done.Attempt == o.Attempt {
		out.Receipt = done.Receipt
	}
	return out, nil
}

// failFinal records a final failure and returns it as a *FailedError, or
// errClaimGone when the ledger refused it because the attempt no longer
// holds the operation (a stale token, or another outcome already recorded):
// the operation's outcome is then the ledger's, not this attempt's.
func (c *Client) failFinal(ctx context.Context, o *Operation, ferr error) error {
	f := Failure{Code: failureCode(ferr)}
	f.Message, f.Detail = failureText(ferr)
	fail := func(f Failure) error {
		return c.report(ctx, func(ctx context.Context) error {
			_, err := c.Fail(ctx, o.ID, o.FencingToken, true, f)
			return err
		})
	}
	if !utf8.ValidString(f.Code) {
		f.Code = defaultFailureCode // the request could not even be encoded
	}
	err := fail(f)
	if errors.Is(err, ErrInvalidArgument) && f != (Failure{Code: defaultFailureCode}) {
		// The ledger refuses the code (too long, a control character):
		// the attempt still failed for good, under the default code,
		// rather than leave the claim to expire into UNKNOWN.
		f = Failure{Code: defaultFailureCode}
		err = fail(f)
	}
	if errors.Is(err, ErrStaleToken) || errors.Is(err, ErrCompletionConflict) {
		return errClaimGone
	}
	if err != nil {
		ferr = fmt.Errorf("%w (the ledger did not record it: %w)", ferr, err)
	}
	return &FailedError{Code: f.Code, Message: f.Message, Detail: f.Detail, Reason: "FAILED_FINAL", Err: ferr}
}

// unanswered says whether a ledger call's err leaves open that the ledger
// processed it: no answer arrived (unavailable, timed out, cut off).
func unanswered(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// returnLostClaim is for a call whose Reserve got no answer: the caller
// gave up while it was on the way, or an answer was lost and no repeat
// brought one until the ledger retries were used up (each lost or refused,
// for the tenant's rate say) or the wait deadline ended the wait before the
// next repeat. The ledger may have granted the claim all the same. If
// it did, the claim is returned (FAILED_RETRYABLE: fn never ran) rather
// than left to expire, which would turn an irreversible operation UNKNOWN
// and call for the reconciliation of an attempt that never ran. Only a
// RUNNING record is touched: Reserve again under the same holder then
// recovers this call's claim (EXECUTE, same token) or says someone else
// holds it; a record that does not exist (the Reserve never arrived) is not
// created. All within one call timeout, best effort: a failure leaves the
// claim to its lease, as before.
func (c *Client) returnLostClaim(ctx context.Context, op Op, holder string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.callTimeout)
	defer cancel()
	if o, err := c.Lookup(rctx, op.ID); err != nil || o.State != StateRunning {
		return
	}
	r, err := c.Reserve(rctx, op, holder)
	if err != nil || r.Decision != DecisionExecute {
		return
	}
	_, _ = c.Fail(rctx, op.ID, r.Operation.FencingToken, false, Failure{Code: codeCallerGaveUp})
}

// askReconciler runs r on its own goroutine, so that its context (and
// reconcilerGrace after it) bounds the wait for its answer even when r
// ignores it: a reconciler only reads the destination, so one left behind
// applies nothing, and its late answer is dropped.
func askReconciler(ctx context.Context, r Reconciler, o *Operation) (Finding, error) {
	type answer struct {
		f        Finding
		err      error
		panicked bool
		p        any
	}
	ch := make(chan answer, 1) // buffered: a reconciler left behind does not block
	go func() {
		defer func() {
			if p := recover(); p != nil {
				ch <- answer{panicked: true, p: p}
			}
		}()
		f, err := r(ctx, o)
		ch <- answer{f: f, err: err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-ctx.Done():
		// A reconciler that honours its context answers at once, maybe
		// with a finding it already had: it gets a moment for that.
		grace := time.NewTimer(reconcilerGrace)
		defer grace.Stop()
		select {
		case a = <-ch:
		case <-grace.C:
			return Finding{}, fmt.Errorf("no answer: %w", context.Cause(ctx))
		}
	}
	if a.panicked {
		panic(a.p) // on the caller's goroutine, as if r had run there
	}
	return a.f, a.err
}

// reconcilerGrace is how long a reconciler may still answer after its
// context ended.
const reconcilerGrace = time.Second

// errClaimGone: an attempt's final failure was refused because the claim
// was no longer the attempt's (see failFinal).
var errClaimGone = errors.New("client: the claim was gone when the attempt's final failure was reported")

// codeCallerGaveUp is the failure code of a claim returned unused because
// its caller gave up (or its wait deadline passed) before fn could run.
const codeCallerGaveUp = "caller_gave_up"

// reportFailure records a retryable (proven not applied, with the failure
// code given) or ambiguous attempt and returns the record after it (nil
// when the claim was already gone, which needs no report).
func (c *Client) reportFailure(ctx context.Context, o *Operation, class Class, code string) (*Operation, error) {
	var now *Operation
	err := c.report(ctx, func(ctx context.Context) (err error) {
		if class == Retryable {
			now, err = c.Fail(ctx, o.ID, o.FencingToken, false, Failure{Code: code})
		} else {
			now, err = c.MarkUnknown(ctx, o.ID, o.FencingToken, "ambiguous outcome")
		}
		return err
	})
	if errors.Is(err, ErrStaleToken) {
		return nil, nil
	}
	return now, err
}

// settleLast reconciles the last, ambiguous attempt of a call that has no
// attempts left: found applied, its result is returned; otherwise the call
// ends as exhausted (or needing reconciliation).
func (c *Client) settleLast(ctx, wctx context.Context, tool string, pol ToolPolicy, o *Operation, attempts int, ferr error) (Result, error) {
	now, err := c.reconcile(ctx, wctx, tool, pol, o, ferr)
	if err != nil {
		return Result{}, err
	}
	if now == nil { // settled by someone else: read how
		_ = c.report(ctx, func(ctx context.Context) (err error) {
			now, err = c.Lookup(ctx, o.ID)
			return err
		})
	}
	if now != nil && (now.State == StateSucceeded || now.State == StateFailedFinal) {
		return replay(now)
	}
	return Result{}, &ExhaustedError{Attempts: attempts, Ambiguous: now == nil || now.State == StateUnknown, Err: ferr}
}

// reconcile runs the tool's reconciler on an operation whose outcome is
// unknown, unless it was escalated to a human, and records its finding. It returns the record after it (nil when
// someone else got there first); either way the caller may Reserve again.
// The reconciler (it applies nothing) and the wait for a live claim end at
// wctx's wait deadline too, with a *waitCutError; the finding, once the
// reconciler has it, is recorded whatever the deadline.
func (c *Client) reconcile(ctx, wctx context.Context, tool string, pol ToolPolicy, o *Operation, lastErr error) (*Operation, error) {
	r := c.reconciler(tool)
	if r == nil || o.NeedsReview {
		// Once a human was asked, a human settles it.
		return nil, &ReconcileError{Operation: o, Escalated: o.NeedsReview, Err: lastErr}
	}
	if pastWaitDeadline(ctx) {
		return nil, &waitCutError{wait: WaitReconciliation}
	}
	rctx, cancel := context.WithTimeout(wctx, pol.Timeout)
	f, err := askReconciler(rctx, r, o)
	cancel()
	if err != nil {
		if pastWaitDeadline(ctx) {
			return nil, &waitCutError{wait: WaitReconciliation}
		}
		return nil, &ReconcileError{Operation: o, Escalated: o.NeedsReview, Err: fmt.Errorf("reconciler: %w", err)}
	}
	if f.FencingToken == 0 {
		// The finding is about the attempt the snapshot shows: if another
		// attempt holds the operation by the time it arrives, it must not
		// resolve that one.
		f.FencingToken = o.FencingToken
	}
	var (
		busy time.Duration
		now  *Operation
	)
	err = c.report(ctx, func(ctx context.Context) (err error) {
		now, err = c.Reconcile(ctx, o.ID, f)
		var le *Error
		if errors.As(err, &le) && errors.Is(err, ErrInProgress) {
			busy = le.RetryAfter
		}
		return err
	})
	switch {
	case errors.Is(err, ErrAlreadyResolved), errors.Is(err, ErrStaleToken):
		return nil, nil // someone else settled it or claimed it again: Reserve reads it
	case errors.Is(err, ErrInProgress):
		if err := pause(ctx, wctx, max(busy, c.backoff.Delay(1))); err != nil {
			if err == errWaitDeadline {
				return nil, &waitCutError{wait: WaitInProgress}
			}
			return nil, err
		}
		return nil, nil
	case err != nil:
		// The operation is still unresolved, whatever kept the finding out.
		return nil, &ReconcileError{Operation: o, Escalated: o.NeedsReview, Err: fmt.Errorf("recording the finding: %w", err)}
	case f.Kind == Escalate:
		return now, &ReconcileError{Operation: now, Escalated: true, Err: lastErr}
	}
	return now, nil
}

// replay returns a terminal operation's recorded outcome.
func replay(o *Operation) (Result, error) {
	if o.State == StateSucceeded {
		r := Result{Replayed: true, Attempt: o.Attempt, Receipt: o.Receipt}
		if o.Result != nil {
			r.Data, r.ResourceID = o.Result.Data, o.Result.ResourceID
		}
		return r, nil
	}
	f := &FailedError{Reason: o.Reason, Replayed: true}
	if o.Failure != nil {
		f.Code, f.Message, f.Detail = o.Failure.Code, o.Failure.Message, o.Failure.Detail
	}
	return Result{}, f
}

// call runs one ledger call with the call timeout, repeating it while the
// ledger is unavailable or the tenant is over its rate (at most
// ledgerRetries more times, waiting the backoff or the RetryInfo's delay).
// Only the ledger's RATE_LIMITED is a rate: a RESOURCE_EXHAUSTED without it
// (ErrMessageTooLarge, a transport size limit) is returned at once.
func (c *Client) call(ctx context.Context, f func(context.Context) error) error {
	return c.callWaiting(ctx, ctx, f)
}

// callWaiting is call whose waits between repeats end at wctx's end too (a
// wait deadline: see waitContext). A wait cut by the wait deadline returns a
// *waitCutError with the last call's error; a call in flight is never cut by
// it.
func (c *Client) callWaiting(ctx, wctx context.Context, f func(context.Context) error) error {
	var err error
	for i := 0; ; i++ {
		cctx, cancel := context.WithTimeout(ctx, c.callTimeout)
		err = f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		timedOut := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
		limited := errors.Is(err, ErrRateLimited)
		if !errors.Is(err, ErrUnavailable) && !timedOut && !limited {
			return err
		}
		if i >= c.ledgerRetries {
			if timedOut {
				return fmt.Errorf("%w: no answer within %s: %w", ErrUnavailable, c.callTimeout, err)
			}
			return err
		}
		wait := c.backoff.Delay(i + 1)
		var le *Error
		if errors.As(err, &le) && le.RetryAfter > wait {
			wait = le.RetryAfter // the ledger says when (RetryInfo)
		}
		if serr := pause(ctx, wctx, wait); serr != nil {
			if serr == errWaitDeadline {
				return &waitCutError{wait: WaitLedger, err: err}
			}
			return err
		}
	}
}

// report runs a call that records an outcome: like call, but it goes on
// when ctx has ended, for at most the report timeout. A call that got no
// answer from the ledger (unavailable, timed out, cut off, or a status
// without the ledger's ErrorInfo) returns an error matching ErrUnavailable,
// whether or not the report timeout ended it: the outcome is not recorded.
func (c *Client) report(ctx context.Context, f func(context.Context) error) error {
	budget := c.reportTimeout
	if budget <= 0 {
		budget = defaultReportTimeout
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
	defer cancel()
	err := c.call(rctx, f)
	if err == nil || answered(err) || errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: no answer while recording the outcome: %w", ErrUnavailable, err)
}

// answered says whether err is the ledger's own answer (a status with its
// ErrorInfo, or the SDK's refusal of a request it cannot send) rather than a
// failure to get one.
func answered(err error) bool {
	var le *Error
	return errors.As(err, &le) && le.Reason != ""
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
