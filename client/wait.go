package client

import (
	"context"
	"errors"
	"time"
)

// waitDeadlineKey is the context key of a wait deadline.
type waitDeadlineKey struct{}

// WithWaitDeadline returns a copy of ctx carrying a wait deadline for Do: a
// bound on how long Do waits (on another holder's claim, a backoff, a
// reconciler) that cancels nothing already running. After it, Do sends no
// new Reserve and runs fn on no new claim; it returns a *WaitDeadlineError.
// Contexts derived from the result carry it too; the earliest counts. A
// zero d is none. docs/client.md ("Bounding the waits") has the details.
func WithWaitDeadline(ctx context.Context, d time.Time) context.Context {
	if d.IsZero() {
		return ctx
	}
	if cur, ok := WaitDeadline(ctx); ok && !d.Before(cur) {
		return ctx
	}
	return context.WithValue(ctx, waitDeadlineKey{}, d)
}

// WaitDeadline returns the wait deadline ctx carries (see WithWaitDeadline),
// and whether it carries one.
func WaitDeadline(ctx context.Context) (time.Time, bool) {
	d, ok := ctx.Value(waitDeadlineKey{}).(time.Time)
	return d, ok
}

// Wait names what Do waited for when its wait deadline came (see
// WaitDeadlineError).
type Wait string

// What Do waits for.
const (
	// WaitNone: the deadline came before Do waited at all: before its first
	// Reserve, or while the Reserve that brought a claim was on its way.
	WaitNone Wait = ""
	// WaitInProgress: another holder's live claim (IN_PROGRESS, or a
	// Reconcile refused with OPERATION_IN_PROGRESS).
	WaitInProgress Wait = "in_progress"
	// WaitBackoff: the backoff before a new attempt, after one that failed
	// retryably or ambiguously.
	WaitBackoff Wait = "backoff"
	// WaitLedger: the backoff before repeating a Reserve that got no answer
	// (ErrUnavailable, a call timeout) or was over the tenant's rate.
	WaitLedger Wait = "ledger"
	// WaitReconciliation: the reconciler's answer about an operation whose
	// outcome is unknown.
	WaitReconciliation Wait = "reconciliation"
)

// errWaitDeadline is the cause of the context Do waits on when its wait
// deadline comes.
var errWaitDeadline = errors.New("client: the wait deadline passed")

// waitContext returns the context Do waits on: ctx, ending at until too when
// until is set. Only waits use it: never fn, a ledger call or a report.
func waitContext(ctx context.Context, until time.Time, bounded bool) (context.Context, context.CancelFunc) {
	if !bounded {
		return ctx, func() {}
	}
	return context.WithDeadlineCause(ctx, until, errWaitDeadline)
}

// pause waits d on wctx (ctx, or ctx bounded by the wait deadline): nil when
// d has passed, ctx's error when ctx ended first, errWaitDeadline when the
// wait deadline came first.
func pause(ctx, wctx context.Context, d time.Duration) error {
	if err := sleep(wctx, d); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return errWaitDeadline
	}
	return nil
}

// pastWaitDeadline says whether the wait deadline ctx carries has come,
// while ctx itself has not ended.
func pastWaitDeadline(ctx context.Context) bool {
	d, ok := WaitDeadline(ctx)
	return ok && ctx.Err() == nil && !time.Now().Before(d)
}

// waitCutError is a wait of one of Do's helpers cut by the wait deadline; Do
// returns it as a *WaitDeadlineError.
type waitCutError struct {
	wait Wait
	err  error // the ledger's error, when a call was to be repeated
}

func (e *waitCutError) Error() string {
	return "client: the wait deadline passed (" + string(e.wait) + ")"
}

// waitCut says whether err is a wait cut by the wait deadline, and which.
func waitCut(err error) (Wait, bool) {
	var cut *waitCutError
	if errors.As(err, &cut) {
		return cut.wait, true
	}
	return WaitNone, false
}
