package server

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/ledger"
)

// ErrorDomain is the domain of every ErrorInfo the service returns.
const ErrorDomain = "ledger.v1"

// The ErrorInfo reasons (wire): clients branch on these, never on messages.
const (
	ReasonKeyReused          = "IDEMPOTENCY_KEY_REUSED"
	ReasonKeyExpired         = "IDEMPOTENCY_KEY_EXPIRED"
	ReasonStaleToken         = "STALE_FENCING_TOKEN"
	ReasonCompletionConflict = "COMPLETION_CONFLICT"
	ReasonAlreadyResolved    = "ALREADY_RESOLVED"
	ReasonInProgress         = "OPERATION_IN_PROGRESS"
	ReasonNotFound           = "NOT_FOUND"
	ReasonInvalidArgument    = "INVALID_ARGUMENT"
	ReasonStoreUnavailable   = "STORE_UNAVAILABLE"
	ReasonUnauthenticated    = "UNAUTHENTICATED"
	ReasonPermissionDenied   = "PERMISSION_DENIED"
	ReasonRateLimited        = "RATE_LIMITED"
	ReasonUnresolvedLimit    = "UNRESOLVED_LIMIT"
	ReasonNotReplicated      = "NOT_REPLICATED"
	ReasonRunStepLimit       = "RUN_STEP_LIMIT"
	ReasonRunDeadline        = "RUN_DEADLINE"
	ReasonRunRepetition      = "RUN_REPETITION"
	ReasonRunEnded           = "RUN_ENDED"
	ReasonNotCompensable     = "NOT_COMPENSABLE"
	ReasonInternal           = "INTERNAL"
	ReasonCanceled           = "CANCELED"
	ReasonDeadlineExceeded   = "DEADLINE_EXCEEDED"
)

// storeRetryDelay is the RetryInfo suggested with STORE_UNAVAILABLE.
const storeRetryDelay = 200 * time.Millisecond

// toStatus converts an error of package ledger into the gRPC status the
// contract names (contract.md §5), with an ErrorInfo and, where they apply,
// BadRequest field violations or RetryInfo. Messages name fields, ids and
// states, never parameter values or results.
func toStatus(err error) *status.Status {
	switch {
	case errors.Is(err, context.Canceled):
		return withDetails(codes.Canceled, "the call was canceled", info(ReasonCanceled, nil))
	case errors.Is(err, context.DeadlineExceeded):
		return withDetails(codes.DeadlineExceeded, "the deadline passed before the store answered; retry the same call", info(ReasonDeadlineExceeded, nil))
	}
	var e *ledger.Error
	if !errors.As(err, &e) {
		return withDetails(codes.Internal, "internal error", info(ReasonInternal, nil))
	}
	switch e.Kind {
	case ledger.KindInvalid:
		br := &errdetails.BadRequest{}
		var fields []string
		for _, v := range e.Violations {
			br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description})
			fields = append(fields, v.Field+": "+v.Description)
		}
		return withDetails(codes.InvalidArgument, "invalid request: "+strings.Join(fields, "; "), info(ReasonInvalidArgument, nil), br)
	case ledger.KindNotFound:
		if e.Op == "ledger.GetRun" || e.Op == "ledger.EndRun" {
			return withDetails(codes.NotFound, "no such run", info(ReasonNotFound, nil))
		}
		return withDetails(codes.NotFound, "no such operation", info(ReasonNotFound, nil))
	case ledger.KindKeyReused:
		if e.Run != nil {
			return withDetails(codes.FailedPrecondition,
				"the run exists with other limits; GetRun shows them",
				info(ReasonKeyReused, map[string]string{"differs": "limits"}))
		}
		differs := strings.Join(e.Differs, ",")
		md := map[string]string{"differs": differs}
		if e.Receipt != "" {
			md["receipt"] = e.Receipt
		}
		return withDetails(codes.FailedPrecondition,
			"the operation_id is bound to another request ("+differs+" differ); stop: a retry must repeat the request exactly, and only a new intent gets a new operation_id",
			info(ReasonKeyReused, md))
	case ledger.KindKeyExpired:
		return withDetails(codes.FailedPrecondition,
			"the operation expired (it ended "+e.State.String()+"); it is not executed again",
			info(ReasonKeyExpired, expiredMetadata(e)))
	case ledger.KindStaleToken:
		return withDetails(codes.FailedPrecondition,
			"the fencing token is not the current attempt's (or its lease expired); stop this attempt",
			info(ReasonStaleToken, map[string]string{"state": stateName(e.State)}))
	case ledger.KindCompletionConflict:
		return withDetails(codes.FailedPrecondition,
			"another outcome is already recorded for this attempt; read the record",
			info(ReasonCompletionConflict, map[string]string{"state": stateName(e.State)}))
	case ledger.KindAlreadyResolved:
		return withDetails(codes.FailedPrecondition,
			"the operation is already resolved with another finding or outcome; read the record",
			info(ReasonAlreadyResolved, map[string]string{"state": stateName(e.State)}))
	case ledger.KindInProgress:
		return withDetails(codes.FailedPrecondition,
			"a live claim holds the operation; retry after its lease",
			info(ReasonInProgress, nil), &errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)})
	case ledger.KindQuotaExceeded:
		return withDetails(codes.ResourceExhausted,
			"the tenant holds as many unresolved operations as it may; resolve some (ListUnresolved) before starting new ones",
			info(ReasonUnresolvedLimit, nil), &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	case ledger.KindNotReplicated:
		return withDetails(codes.Unavailable,
			"the call ran on the primary (what it wrote stands there) but fewer replicas than required acknowledged it; retry the same call",
			info(ReasonNotReplicated, map[string]string{"acknowledged": strconv.Itoa(e.Replicas)}),
			&errdetails.RetryInfo{RetryDelay: durationpb.New(storeRetryDelay)})
	case ledger.KindRunEnded:
		return runEndedStatus(e)
	case ledger.KindNotCompensable:
		return notCompensableStatus(e)
	case ledger.KindUnavailable:
		return withDetails(codes.Unavailable,
			"the store is unavailable or refused the write; retry the same call, and never execute without a reservation",
			info(ReasonStoreUnavailable, nil), &errdetails.RetryInfo{RetryDelay: durationpb.New(storeRetryDelay)})
	}
	return withDetails(codes.Internal, "internal error", info(ReasonInternal, nil))
}

func info(reason string, md map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: md}
}

func withDetails(c codes.Code, msg string, details ...protoadapt.MessageV1) *status.Status {
	st := status.New(c, msg)
	withD, err := st.WithDetails(details...)
	if err != nil {
		return st
	}
	return withD
}

func stateName(s ledger.State) string { return ledgerv1.State(s).String() }

// notCompensableMessages explain each cause of NOT_COMPENSABLE.
var notCompensableMessages = map[string]string{
	"not_found":     "the operation named by compensates does not exist",
	"expired":       "the operation named by compensates has expired; only its tombstone is left",
	"not_succeeded": "the operation named by compensates has not succeeded; only a SUCCEEDED operation can be compensated (reconcile it first)",
	"limit":         "the operation named by compensates has as many compensations as it may (" + strconv.Itoa(ledger.MaxCompensations) + ")",
}

// notCompensableStatus is NOT_COMPENSABLE, with the cause and, where the
// compensated operation has a record, its state.
func notCompensableStatus(e *ledger.Error) *status.Status {
	md := map[string]string{"cause": e.Cause}
	if e.State != ledger.StateUnspecified {
		md["state"] = stateName(e.State)
	}
	return withDetails(codes.FailedPrecondition, notCompensableMessages[e.Cause], info(ReasonNotCompensable, md))
}

// expiredMetadata is the metadata of IDEMPOTENCY_KEY_EXPIRED: the final
// state, and the history chain's head when Lookup read the tombstone.
func expiredMetadata(e *ledger.Error) map[string]string {
	md := map[string]string{"final_state": stateName(e.State)}
	if e.HistoryHead != "" {
		md["history_head"] = e.HistoryHead
	}
	return md
}
