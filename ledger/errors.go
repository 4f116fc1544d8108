package ledger

import (
	"errors"

	"strconv"
	"strings"
	"time"

	"github.com/opledger/ledger/fingerprint"
)

// Kind classifies an error. Kinds are appended to, never reordered.
type Kind uint8

// The kinds of ledger errors.
const (
	KindOther              Kind = iota // an unexpected failure (a bug, a script error)
	KindInvalid                        // bad input; see Error.Violations
	KindNotFound                       // no such operation
	KindKeyReused                      // same id, different tool, params or permit
	KindKeyExpired                     // the record expired; its tombstone is left
	KindStaleToken                     // not the current attempt's fencing token
	KindCompletionConflict             // another outcome is already recorded
	KindAlreadyResolved                // resolved with another finding or outcome
	KindInProgress                     // a live claim holds the operation
	KindUnavailable                    // the store is unreachable or refused the write
	KindQuotaExceeded                  // the tenant holds too many unresolved operations
	KindNotReplicated                  // fewer replicas than required acknowledged the write
	KindRunEnded                       // the run has ended, or a new step would pass its limit
	KindNotCompensable                 // the operation named by compensates cannot take a compensation
)

var kindNames = [...]string{
	"other error", "invalid argument", "not found", "idempotency key reused",
	"idempotency key expired", "stale fencing token", "completion conflict",
	"already resolved", "operation in progress", "store unavailable",
	"unresolved operations limit reached", "write not replicated", "run ended",
	"not compensable",
}

// String describes the kind.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind " + itoa(int64(k))
}

// Sentinel errors, one per kind, for errors.Is: errors.Is(err, ErrKeyReused)
// holds for every *Error of KindKeyReused.
var (
	ErrInvalid            = &Error{Kind: KindInvalid}
	ErrNotFound           = &Error{Kind: KindNotFound}
	ErrKeyReused          = &Error{Kind: KindKeyReused}
	ErrKeyExpired         = &Error{Kind: KindKeyExpired}
	ErrStaleToken         = &Error{Kind: KindStaleToken}
	ErrCompletionConflict = &Error{Kind: KindCompletionConflict}
	ErrAlreadyResolved    = &Error{Kind: KindAlreadyResolved}
	ErrInProgress         = &Error{Kind: KindInProgress}
	ErrUnavailable        = &Error{Kind: KindUnavailable}
	ErrQuotaExceeded      = &Error{Kind: KindQuotaExceeded}
	ErrNotReplicated      = &Error{Kind: KindNotReplicated}
	ErrRunEnded           = &Error{Kind: KindRunEnded}
	ErrNotCompensable     = &Error{Kind: KindNotCompensable}
)

// Violation is one problem with one input field, named as on the wire
// (e.g. "operation_id", "result.data").
type Violation struct {
	Field       string
	Description string
}

// Error is the error every ledger method returns. Its fields other than Op,
// Kind and Err are set for the kinds that have them. Messages name fields and
// ids, never parameter values, results or secrets.
type Error struct {
	Op   string // the method, e.g. "ledger.Reserve"
	Kind Kind
	// Violations lists the bad fields (KindInvalid).
	Violations []Violation
	// Differs names what differs from the record: "tool", "params",
	// "permit", "compensates" (KindKeyReused).
	Differs []string
	// Fingerprint is the refused request's fingerprint, as compared with
	// the record's (KindKeyReused from Reserve).
	Fingerprint fingerprint.Fingerprint
	// Receipt is a signed receipt of the refusal, set by the server when
	// receipts are on (KindKeyReused from Reserve).
	Receipt string
	// State is the record's state where it explains the error: the final
	// state of an expired record (KindKeyExpired), the current state
	// (KindStaleToken, KindCompletionConflict, KindAlreadyResolved).
	State State
	// HistoryHead is the head of the history chain the expired record's
	// tombstone keeps (KindKeyExpired from Lookup).
	HistoryHead string
	// RetryAfter is when the live claim's lease ends (KindInProgress).
	RetryAfter time.Duration
	// Replicas is how many replicas acknowledged a write
	// (KindNotReplicated).
	Replicas int
	// Run is the run as it is now (KindRunEnded; KindKeyReused from
	// StartRun), and Limit the limit this call reached and so ended the
	// run with ("max_steps", "max_irreversible", "max_repeats",
	// "deadline"; empty when it had ended before).
	Run   *Run
	Limit string
	// Cause is why the operation named by compensates refused the link
	// (KindNotCompensable): "not_found", "expired", "not_succeeded" (State
	// is its state) or "limit" (it has MaxCompensations).
	Cause string
	// Operation is the record where the caller can use it
	// (KindCompletionConflict, KindAlreadyResolved, KindInProgress).
	Operation *Operation
	Err       error // the cause, if any
}

// Error describes the error without parameter values.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	b.WriteString(e.Kind.String())
	switch {
	case len(e.Violations) > 0:
		b.WriteString(": ")
		for i, v := range e.Violations {
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString(v.Field + ": " + v.Description)
		}
	case len(e.Differs) > 0:
		b.WriteString(": " + strings.Join(e.Differs, ", ") + " differ from the recorded operation")
	case e.State != StateUnspecified:
		b.WriteString(" (state " + e.State.String() + ")")
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is the sentinel of e's kind.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Op == "" && t.Err == nil && t.Violations == nil && t.Kind == e.Kind
}

// KindOf returns the kind of err: its *Error's kind, or KindOther.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindOther
}

func invalid(op string, vs ...Violation) error {
	return &Error{Op: op, Kind: KindInvalid, Violations: vs}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
