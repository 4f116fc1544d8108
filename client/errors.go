package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors, for errors.Is. Every ErrorInfo reason of the ledger maps
// to one; the SDK's own outcomes have theirs.
var (
	// ErrKeyReused: the operation id is bound to another tool, params or
	// permit. Stop: a retry must repeat the request exactly; only a new
	// intent gets a new id, and the SDK never mints one on its own.
	ErrKeyReused = errors.New("idempotency key reused for a different request")
	// ErrKeyExpired: the operation expired and only its tombstone is left;
	// it is not executed again. A human or planner decides.
	ErrKeyExpired = errors.New("idempotency key expired")
	// ErrStaleToken: the attempt's claim is gone (another attempt holds the
	// operation, or its lease ended).
	ErrStaleToken = errors.New("stale fencing token")
	// ErrCompletionConflict: another outcome is already recorded.
	ErrCompletionConflict = errors.New("completion conflict")
	// ErrAlreadyResolved: the operation was resolved with another finding,
	// or with another result (failure) than an Applied (Abandon) finding
	// gives: the recorded one stands.
	ErrAlreadyResolved = errors.New("already resolved")
	// ErrInProgress: a live claim holds the operation (Reconcile).
	ErrInProgress = errors.New("operation in progress")
	// ErrNotFound: no such operation in the caller's tenant.
	ErrNotFound = errors.New("operation not found")
	// ErrInvalidArgument: the request is malformed; see Error.Violations.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrUnavailable: the ledger (or its store) cannot be reached, or gave
	// no answer. Without a reservation the tool is not run; when Do was
	// recording how the tool ended, the outcome is not recorded and the
	// effect may exist: retry only under the same operation id.
	ErrUnavailable = errors.New("ledger unavailable")
	// ErrUnauthenticated: no or bad credentials.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the credentials lack the scope.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrRateLimited: the tenant is over its rate; see Error.RetryAfter.
	ErrRateLimited = errors.New("rate limited")
	// ErrQuotaExceeded: the tenant holds as many unresolved operations as it
	// may; new ones are refused until some are resolved.
	ErrQuotaExceeded = errors.New("unresolved operations limit reached")
	// ErrNotCompensable: the operation named by Compensates did not succeed
	// (or does not exist, or has all the compensations it may take); the
	// compensation was not reserved. Error.Metadata["cause"] says which.
	ErrNotCompensable = errors.New("not compensable")

	// ErrNeedsReconciliation: nobody knows whether the effect happened, and
	// no reconciler settled it (none registered, or it escalated to a
	// human). The tool is not run again until someone reconciles.
	ErrNeedsReconciliation = errors.New("operation needs reconciliation")
	// ErrOperationFailed: the operation failed for good (this call's final
	// failure, or a recorded one replayed); see *FailedError.
	ErrOperationFailed = errors.New("operation failed")
	// ErrRetriesExhausted: no attempts are left, by the tool policy of this
	// call or by the ledger's max attempts (RETRIES_EXHAUSTED).
	ErrRetriesExhausted = errors.New("retries exhausted")
	// ErrCompletionNotRecorded: fn's effect happened and its result is
	// returned, but the ledger did not record it (it gave no answer, or
	// refused the report as malformed), and holds no other outcome for the
	// attempt: the operation surfaces as UNKNOWN and reconciles as applied.
	// When the ledger records another outcome instead, Do returns
	// ErrConflictingOutcome.
	ErrCompletionNotRecorded = errors.New("completion not recorded")
	// ErrConflictingOutcome: fn's effect happened and its result is
	// returned, but the ledger refused to record it because it holds another
	// outcome (the attempt's claim was gone: a reconciler found nothing and
	// another attempt claimed the operation, or recorded another outcome);
	// see *ConflictingOutcomeError. The record does not reflect the effect,
	// which may have been applied twice: escalate, never retry.
	ErrConflictingOutcome = errors.New("the effect happened but the ledger records another outcome")
	// ErrWaitDeadline: Do stopped waiting at the wait deadline its context
	// carries (WithWaitDeadline) before the operation settled for this
	// caller; see *WaitDeadlineError. Its effect may exist: retry only under
	// the same operation id.
	ErrWaitDeadline = errors.New("wait deadline passed")
	// ErrMessageTooLarge: a request or its response exceeded a size limit of
	// the gRPC transport (a RESOURCE_EXHAUSTED status without the ledger's
	// ErrorInfo: grpc-go's own answer, on the ledger's side for a request far
	// over the ledger's size limit, on this side for a response larger than
	// the connection's maximum receive size). It is no rate limit, and
	// repeating the call cannot help: shrink the params or the result data,
	// or raise the receive limit (grpc.MaxCallRecvMsgSize).
	ErrMessageTooLarge = errors.New("message exceeds the gRPC transport's size limit")
)

var reasons = map[string]error{
	"IDEMPOTENCY_KEY_REUSED":  ErrKeyReused,
	"IDEMPOTENCY_KEY_EXPIRED": ErrKeyExpired,
	"STALE_FENCING_TOKEN":     ErrStaleToken,
	"COMPLETION_CONFLICT":     ErrCompletionConflict,
	"ALREADY_RESOLVED":        ErrAlreadyResolved,
	"OPERATION_IN_PROGRESS":   ErrInProgress,
	"NOT_FOUND":               ErrNotFound,
	"INVALID_ARGUMENT":        ErrInvalidArgument,
	"STORE_UNAVAILABLE":       ErrUnavailable,
	"NOT_REPLICATED":          ErrUnavailable,
	"UNAUTHENTICATED":         ErrUnauthenticated,
	"PERMISSION_DENIED":       ErrPermissionDenied,
	"RATE_LIMITED":            ErrRateLimited,
	"UNRESOLVED_LIMIT":        ErrQuotaExceeded,
	"RUN_STEP_LIMIT":          ErrRunEnded,
	"RUN_DEADLINE":            ErrRunEnded,
	"RUN_REPETITION":          ErrRunEnded,
	"RUN_ENDED":               ErrRunEnded,
	"NOT_COMPENSABLE":         ErrNotCompensable,
}

var byCode = map[codes.Code]error{
	codes.NotFound:         ErrNotFound,
	codes.InvalidArgument:  ErrInvalidArgument,
	codes.Unavailable:      ErrUnavailable,
	codes.Unauthenticated:  ErrUnauthenticated,
	codes.PermissionDenied: ErrPermissionDenied,
	// Only the ledger's reasons (RATE_LIMITED, UNRESOLVED_LIMIT) say "back
	// off"; without them, RESOURCE_EXHAUSTED is the transport's size limit.
	codes.ResourceExhausted: ErrMessageTooLarge,
}

// FieldViolation is one bad request field.
type FieldViolation struct {
	Field       string
	Description string
}

// Error is an error the ledger returned: its status code, its ErrorInfo
// reason and metadata, and the details that come with it.
type Error struct {
	Code       codes.Code
	Reason     string            // ErrorInfo reason, e.g. IDEMPOTENCY_KEY_REUSED
	Message    string            // the status message
	Metadata   map[string]string // ErrorInfo metadata, e.g. differs=params
	RetryAfter time.Duration     // from RetryInfo, when present
	Violations []FieldViolation  // from BadRequest, with INVALID_ARGUMENT
	sentinel   error
}

// Error describes the error.
func (e *Error) Error() string {
	if e.Reason != "" {
		return "ledger: " + e.Reason + ": " + e.Message
	}
	if e.sentinel == ErrMessageTooLarge {
		return "ledger: " + e.Code.String() + ": " + ErrMessageTooLarge.Error() + " (not a rate limit; not retried): " + e.Message
	}
	return "ledger: " + e.Code.String() + ": " + e.Message
}

// Is matches the sentinel of the error's reason (or code).
func (e *Error) Is(target error) bool { return e.sentinel != nil && target == e.sentinel }

// fromStatus converts a gRPC error into an *Error; context errors and nil
// pass through.
func fromStatus(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message()}
	for _, d := range st.Details() {
		switch v := d.(type) {
		case *errdetails.ErrorInfo:
			e.Reason, e.Metadata = v.GetReason(), v.GetMetadata()
		case *errdetails.RetryInfo:
			e.RetryAfter = v.GetRetryDelay().AsDuration()
		case *errdetails.BadRequest:
			for _, fv := range v.GetFieldViolations() {
				e.Violations = append(e.Violations, FieldViolation{fv.GetField(), fv.GetDescription()})
			}
		}
	}
	if e.sentinel = reasons[e.Reason]; e.sentinel == nil {
		e.sentinel = byCode[e.Code]
		if e.sentinel == ErrMessageTooLarge && e.Reason != "" {
			// The ledger's own refusal, for a reason this SDK does not
			// know: not the transport's size limit.
			e.sentinel = nil
		}
	}
	switch e.Code {
	case codes.DeadlineExceeded:
		return fmt.Errorf("%w: %w", e, context.DeadlineExceeded)
	case codes.Canceled:
		return fmt.Errorf("%w: %w", e, context.Canceled)
	}
	return e
}

// FailedError is an operation that failed for good.
type FailedError struct {
	// Code and Message are the recorded failure.
	Code, Message string
	// Detail is the recorded failure's detail (MarkFinalDetail); Error
	// leaves it out, so that logging the error does not log it.
	Detail string
	// Reason is the ledger's reason for the final state, e.g. FAILED_FINAL,
	// RETRIES_EXHAUSTED or ABANDONED.
	Reason string
	// Replayed is true when the failure was recorded by an earlier call.
	Replayed bool
	// Err is fn's error, when this call ran the failing attempt.
	Err error
}

// Error describes the failure.
func (e *FailedError) Error() string {
	var b strings.Builder
	b.WriteString("operation failed")
	if e.Code != "" {
		b.WriteString(": " + e.Code)
	}
	if e.Reason != "" && e.Reason != "FAILED_FINAL" {
		b.WriteString(" (" + e.Reason + ")")
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	} else if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// Is matches ErrOperationFailed, and ErrRetriesExhausted when the ledger ran
// out of attempts.
func (e *FailedError) Is(target error) bool {
	return target == ErrOperationFailed || target == ErrRetriesExhausted && e.Reason == "RETRIES_EXHAUSTED"
}

// Unwrap returns fn's error, if any.
func (e *FailedError) Unwrap() error { return e.Err }

// ReconcileError is an operation that needs reconciliation before anything
// else may happen to it.
type ReconcileError struct {
	// Operation is the record as last seen.
	Operation *Operation
	// Escalated is true when a reconciler handed it to a human.
	Escalated bool
	// Err is the last attempt's error, if this call ran one, or why the
	// ledger did not record a reconciler's finding.
	Err error
}

// Error describes it.
func (e *ReconcileError) Error() string {
	msg := "operation " + e.Operation.ID + " needs reconciliation"
	if e.Escalated {
		msg += " (escalated to a human)"
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is matches ErrNeedsReconciliation.
func (e *ReconcileError) Is(target error) bool { return target == ErrNeedsReconciliation }

// Unwrap returns Err.
func (e *ReconcileError) Unwrap() error { return e.Err }

// ExhaustedError is returned when the tool policy's retries are used up: the
// last attempt failed retryably (the operation is PENDING: a later call may
// try again) or ambiguously (it is UNKNOWN and needs reconciliation).
type ExhaustedError struct {
	Attempts int
	// Ambiguous is true when the last outcome could not be told.
	Ambiguous bool
	Err       error // the last attempt's error
}

// Error describes it.
func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("retries exhausted after %d attempts: %v", e.Attempts, e.Err)
}

// Is matches ErrRetriesExhausted, and ErrNeedsReconciliation when the last
// outcome was ambiguous.
func (e *ExhaustedError) Is(target error) bool {
	return target == ErrRetriesExhausted || target == ErrNeedsReconciliation && e.Ambiguous
}

// Unwrap returns the last attempt's error.
func (e *ExhaustedError) Unwrap() error { return e.Err }

// NotRecordedError is returned with fn's result when the effect happened but
// the ledger did not record the completion: it gave no answer (Err matches
// ErrUnavailable), or refused the report itself (result data it cannot
// carry). The ledger holds no other outcome for the attempt, so the
// operation surfaces as UNKNOWN and reconciles as applied. A report refused
// because the ledger holds another outcome is a *ConflictingOutcomeError.
type NotRecordedError struct{ Err error }

// Error describes it.
func (e *NotRecordedError) Error() string {
	return "the effect happened but the ledger did not record it: " + e.Err.Error()
}

// Is matches ErrCompletionNotRecorded.
func (e *NotRecordedError) Is(target error) bool { return target == ErrCompletionNotRecorded }

// Unwrap returns why the ledger did not record it.
func (e *NotRecordedError) Unwrap() error { return e.Err }

// ConflictingOutcomeError is returned by Do, with fn's result, when fn's
// effect happened but the ledger refused to record it because it holds
// another outcome for the operation: the attempt's claim was gone
// (STALE_FENCING_TOKEN: its lease ended, a reconciler recorded NOT_APPLIED
// or abandoned it, another attempt claimed it) or another outcome was
// recorded with its token (COMPLETION_CONFLICT). Unlike *NotRecordedError,
// nothing will reconcile it as applied: the record says otherwise, another
// attempt may be applying the effect again, and a later call may replay a
// result or failure that is not this effect's. A human compares the
// destination with the record.
//
// It matches ErrConflictingOutcome and ErrNeedsReconciliation (stop and
// escalate), not ErrCompletionNotRecorded, and unwraps to the ledger's
// refusal.
type ConflictingOutcomeError struct {
	// Operation is the record that stands, as read after the refusal; nil
	// when it could not be read.
	Operation *Operation
	// Attempt is the attempt whose effect happened.
	Attempt uint32
	// Err is the ledger's refusal (ErrStaleToken or ErrCompletionConflict).
	Err error
}

// Error describes it, with the record that stands.
func (e *ConflictingOutcomeError) Error() string {
	msg := fmt.Sprintf("attempt %d applied the effect but the ledger records another outcome", e.Attempt)
	if o := e.Operation; o != nil {
		msg += fmt.Sprintf(": operation %s is %s (attempt %d", o.ID, o.State, o.Attempt)
		if o.Reason != "" {
			msg += ", " + o.Reason
		}
		msg += ")"
	}
	return msg + "; escalate, do not retry: " + e.Err.Error()
}

// Is matches ErrConflictingOutcome and ErrNeedsReconciliation.
func (e *ConflictingOutcomeError) Is(target error) bool {
	return target == ErrConflictingOutcome || target == ErrNeedsReconciliation
}

// Unwrap returns the ledger's refusal.
func (e *ConflictingOutcomeError) Unwrap() error { return e.Err }

// WaitDeadlineError is returned by Do when the wait deadline its context
// carries (WithWaitDeadline) came while Do waited, or before it could send
// the next Reserve. The operation did not settle for this caller, and Do
// leaves it as the ledger has it: another holder's claim stays that holder's
// (its effect may be happening now), an ambiguous attempt of this call stays
// UNKNOWN, a retryable one PENDING. The effect may exist: never take this
// error for "not applied", and never retry under a new operation id; a later
// Do of the same Op replays, waits, reconciles or executes as the record
// says.
//
// It matches ErrWaitDeadline only. It does not unwrap to Err, so no
// sentinel or class of an earlier attempt speaks for the operation (ClassOf
// says Ambiguous).
type WaitDeadlineError struct {
	// Deadline is the wait deadline.
	Deadline time.Time
	// Waiting is what Do waited for when the deadline came (WaitNone when it
	// came before Do waited at all).
	Waiting Wait
	// Operation is the record as Do last saw it; nil when no Reserve of this
	// call was answered.
	Operation *Operation
	// Err is, for information, the last attempt's error when this call ran
	// fn, or the ledger's error when Do was about to repeat a Reserve.
	Err error
}

// Error describes it.
func (e *WaitDeadlineError) Error() string {
	msg := "the wait deadline passed"
	switch e.Waiting {
	case WaitInProgress:
		msg += " while another holder's claim was running"
	case WaitBackoff:
		msg += " in the backoff before another attempt"
	case WaitLedger:
		msg += " while the ledger gave no answer"
	case WaitReconciliation:
		msg += " while the reconciler was asked"
	}
	if e.Operation != nil {
		msg += fmt.Sprintf("; operation %s is %s (attempt %d), its outcome unknown to this caller", e.Operation.ID, e.Operation.State, e.Operation.Attempt)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is matches ErrWaitDeadline.
func (e *WaitDeadlineError) Is(target error) bool { return target == ErrWaitDeadline }
