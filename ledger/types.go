package ledger

import (
	"time"

	"github.com/opledger/ledger/fingerprint"
)

// State is where an operation is in its lifecycle. The values equal the
// ledger.v1.State enum numbers.
type State uint8

// The states of an operation.
const (
	StateUnspecified State = iota // not a state
	StatePending                  // claimable: nothing running, nothing known applied
	StateRunning                  // an attempt holds the claim until its lease ends
	StateSucceeded                // terminal: the effect happened, result recorded
	StateFailedFinal              // terminal: failed for good
	StateUnknown                  // nobody knows whether the effect happened
)

var stateNames = [...]string{"UNSPECIFIED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED_FINAL", "UNKNOWN"}

// String returns the state's name, e.g. "RUNNING".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(" + itoa(int64(s)) + ")"
}

// Terminal reports whether the state is SUCCEEDED or FAILED_FINAL.
func (s State) Terminal() bool { return s == StateSucceeded || s == StateFailedFinal }

// Decision tells the caller of Reserve what to do next. The values equal the
// ledger.v1.Decision enum numbers.
type Decision uint8

// The decisions of Reserve.
const (
	DecisionUnspecified Decision = iota
	DecisionExecute              // run the tool under the returned claim
	DecisionReplay               // return the recorded outcome; do not run
	DecisionInProgress           // another caller holds a live claim; wait
	DecisionReconcile            // the outcome is unknown; reconcile first
)

var decisionNames = [...]string{"UNSPECIFIED", "EXECUTE", "REPLAY", "IN_PROGRESS", "RECONCILE"}

// String returns the decision's name, e.g. "EXECUTE".
func (d Decision) String() string {
	if int(d) < len(decisionNames) {
		return decisionNames[d]
	}
	return "Decision(" + itoa(int64(d)) + ")"
}

// Effect says what repeating a tool would do. The values equal the
// ledger.v1.Effect enum numbers.
type Effect uint8

// The effects of a tool.
const (
	EffectUnspecified  Effect = iota // use the policy's default
	EffectReadOnly                   // changes nothing
	EffectIdempotent                 // repeating is harmless
	EffectIrreversible               // repeating could apply the effect twice
)

var effectNames = [...]string{"UNSPECIFIED", "READ_ONLY", "IDEMPOTENT", "IRREVERSIBLE"}

// String returns the effect's name, e.g. "IRREVERSIBLE".
func (e Effect) String() string {
	if int(e) < len(effectNames) {
		return effectNames[e]
	}
	return "Effect(" + itoa(int64(e)) + ")"
}

// Outcome is how a claimed attempt ended. The values equal the
// ledger.v1.Outcome enum numbers.
type Outcome uint8

// The outcomes Complete reports.
const (
	OutcomeUnspecified     Outcome = iota
	OutcomeSucceeded               // the effect happened; the result is recorded
	OutcomeFailedFinal             // failed for good; the failure is recorded
	OutcomeFailedRetryable         // failed, proven not applied: back to PENDING
)

// Finding is what a reconciler learned from the destination. The values
// equal the ledger.v1.Finding enum numbers.
type Finding uint8

// The findings Reconcile accepts.
const (
	FindingUnspecified Finding = iota
	FindingApplied             // the effect exists: SUCCEEDED with the result
	FindingNotApplied          // it does not: PENDING, may run again
	FindingAbandon             // it does not and must not be retried: FAILED_FINAL
	FindingEscalate            // cannot tell: UNKNOWN, flagged for a human
)

// Principal is who calls the ledger: the tenant that scopes every key, and
// the caller's identity within it, recorded in the history.
type Principal struct {
	Tenant string
	ID     string
}

// SweeperPrincipal is the principal recorded for transitions the ledger makes
// on its own (lease expiry found by the sweeper).
const SweeperPrincipal = "ledger"

// Result is the recorded outcome of a successful operation.
type Result struct {
	// Data is the tool's result as canonical JSON (an object), or nil.
	Data []byte
	// ResourceID identifies what the effect created at the destination.
	ResourceID string
}

// Failure is the recorded reason an attempt or operation failed.
type Failure struct {
	Code    string
	Message string // shown to operators: never parameters or secrets
	// Detail is what the destination answered with a final failure,
	// returned on a replay; kept as result data is, never shown.
	Detail string
}

// HistoryEntry is one transition of an operation.
type HistoryEntry struct {
	Time         time.Time
	From, To     State
	Attempt      uint32
	FencingToken uint64
	Principal    string
	Reason       string
	Detail       string
}

// Operation is the snapshot of one operation's record. Times come from the
// store's clock; zero times mean "not set".
type Operation struct {
	ID           string
	Tool         string
	Effect       Effect
	State        State
	Attempt      uint32
	FencingToken uint64
	Fingerprint  fingerprint.Fingerprint
	PermitID     string
	RunID        string
	Step         uint32
	// runGuarded: RunID's run guard admitted the operation when it was
	// created, and holds it until it is terminal.
	runGuarded bool
	// Holder is the holder of the live claim, while RUNNING. It lets its
	// owner recover the claim, so the server never shows it to others.
	Holder      string
	Result      *Result  // when SUCCEEDED
	Failure     *Failure // when FAILED_FINAL, or after a retryable failure
	Reason      string   // reason of the latest transition
	NeedsReview bool     // escalated to a human
	// Compensates is the operation this one compensates, if any.
	Compensates string
	// CompensatedBy are the operations reserved as its compensations, in
	// the order they were reserved (at most MaxCompensations).
	CompensatedBy []string

	CreatedAt        time.Time
	UpdatedAt        time.Time
	LeaseExpiresAt   time.Time // while RUNNING
	UnknownSince     time.Time // while UNKNOWN
	RecoveryDeadline time.Time // while UNKNOWN: UnknownSince + recovery window
	RetainUntil      time.Time
	ExpiresAt        time.Time // when terminal: end of the record's retention
	MaxAttempts      uint32

	// History is filled by Lookup and Reconcile only: the latest
	// HistoryLimit transitions, oldest first.
	History []HistoryEntry

	// hist is the stored history the record came with, and histBase the
	// chain value before its oldest entry ("" when no record came).
	hist, histBase string
}

// HistoryLimit is how many history entries an operation keeps (the latest
// ones); it equals HISTORY_LIMIT in scripts/common.lua.
const HistoryLimit = 50

// ReserveRequest is the input of Reserve.
type ReserveRequest struct {
	OperationID string
	Tool        string
	// Params are the request parameters as JSON-like Go values (from
	// structpb.Struct.AsMap). Only the policy's consequential fields (all of
	// them when it names none) are fingerprinted; nothing is stored.
	Params map[string]any
	// ParamsSHA256 is a precomputed fingerprint instead of Params.
	ParamsSHA256 []byte
	Effect       Effect // unspecified: the policy's default
	PermitID     string
	Holder       string // empty: the ledger generates one
	RunID        string
	Step         uint32
	RetainUntil  time.Time // zero: none
	// Compensates names the SUCCEEDED operation of the same tenant this one
	// compensates (e.g. the charge a refund reverses); empty for none.
	Compensates string
}

// MaxCompensations is how many compensations one operation may have.
const MaxCompensations = 16

// ReserveResult is the decision of Reserve.
type ReserveResult struct {
	Decision   Decision
	Operation  *Operation
	RetryAfter time.Duration // with DecisionInProgress
	Holder     string        // the holder the claim is recorded under
}

// CompleteRequest is the input of Complete.
type CompleteRequest struct {
	OperationID  string
	FencingToken uint64
	Outcome      Outcome
	Result       *Result  // with OutcomeSucceeded
	Failure      *Failure // with the failure outcomes
}

// MarkUnknownRequest is the input of MarkUnknown.
type MarkUnknownRequest struct {
	OperationID  string
	FencingToken uint64
	Reason       string // a note for operators; never parameters or secrets
}

// RenewRequest is the input of Renew.
type RenewRequest struct {
	OperationID  string
	FencingToken uint64
}

// ReconcileRequest is the input of Reconcile.
type ReconcileRequest struct {
	OperationID string
	Finding     Finding
	Result      *Result  // with FindingApplied
	Failure     *Failure // with FindingAbandon (optional)
	// Note is kept in the history. It is part of what makes a call a
	// repeat of an earlier one (with the finding, the principal and the
	// attempt): a second finding about one attempt needs a new note.
	Note string
	// FencingToken is the token of the attempt the finding is about (from
	// the caller's snapshot); 0 for whichever attempt is current. When set
	// and another attempt holds the operation, Reconcile refuses with
	// KindStaleToken and changes nothing.
	FencingToken uint64
}

// ListRequest asks for a page of unresolved operations. An operation is
// listed when it matches every filter given.
type ListRequest struct {
	PageSize  int     // 0: DefaultPageSize; at most MaxPageSize
	PageToken string  // from the previous page
	States    []State // only these (PENDING, RUNNING, UNKNOWN); empty: all
	Tool      string  // only this tool; empty: all
	// Overdue: only UNKNOWN operations past their recovery deadline
	// (RecoveryDeadline at or before the store's time).
	Overdue bool
	// NeedsReview: only operations escalated to a human (NeedsReview).
	NeedsReview bool
}

// ListPage is one page of unresolved operations, oldest first.
type ListPage struct {
	Operations    []*Operation
	NextPageToken string // empty when there are no more
}
