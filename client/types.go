package client

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/jsonvalue"
)

// The wire enums, under shorter names.
type (
	// State is where an operation is in its lifecycle.
	State = ledgerv1.State
	// Decision is what Reserve tells the caller to do.
	Decision = ledgerv1.Decision
	// Effect says what repeating a tool would do.
	Effect = ledgerv1.Effect
	// FindingKind is what a reconciler learned from the destination.
	FindingKind = ledgerv1.Finding
)

// The values of the wire enums.
const (
	StatePending     = ledgerv1.State_STATE_PENDING
	StateRunning     = ledgerv1.State_STATE_RUNNING
	StateSucceeded   = ledgerv1.State_STATE_SUCCEEDED
	StateFailedFinal = ledgerv1.State_STATE_FAILED_FINAL
	StateUnknown     = ledgerv1.State_STATE_UNKNOWN

	DecisionExecute    = ledgerv1.Decision_DECISION_EXECUTE
	DecisionReplay     = ledgerv1.Decision_DECISION_REPLAY
	DecisionInProgress = ledgerv1.Decision_DECISION_IN_PROGRESS
	DecisionReconcile  = ledgerv1.Decision_DECISION_RECONCILE

	EffectUnspecified  = ledgerv1.Effect_EFFECT_UNSPECIFIED
	EffectReadOnly     = ledgerv1.Effect_EFFECT_READ_ONLY
	EffectIdempotent   = ledgerv1.Effect_EFFECT_IDEMPOTENT
	EffectIrreversible = ledgerv1.Effect_EFFECT_IRREVERSIBLE

	Applied    = ledgerv1.Finding_FINDING_APPLIED
	NotApplied = ledgerv1.Finding_FINDING_NOT_APPLIED
	Abandon    = ledgerv1.Finding_FINDING_ABANDON
	Escalate   = ledgerv1.Finding_FINDING_ESCALATE
)

// Op is one logical operation an agent performs through Do.
type Op struct {
	// ID is the stable operation id, minted once when the intent is
	// confirmed and reused on every retry (e.g. run_id + ":" + call_id).
	// Required. The SDK never mints one.
	ID string
	// Tool names what the operation does, e.g. "payments.refund". Required.
	Tool string
	// Params are the consequential parameters, fingerprinted by the ledger
	// (never stored): JSON-like values (map[string]any, []any, string,
	// float64, int, bool, nil). Other Go values ([]string,
	// map[string]string, []int, int32, time.Time, structs...) are
	// fingerprinted and sent as their JSON encoding, so they are the same
	// request as the JSON values they encode to (what a caller in another
	// language sends). Integers stay exact: a Go integer beyond 2^53, which
	// a double would round, is refused (ErrInvalidArgument), as are values
	// with no JSON form (strings that are not valid UTF-8 among them); a
	// large float64, even in a []float64, is the double it is.
	Params map[string]any
	// PermitID is the authorization grant the agent acts under.
	PermitID string
	// RunID and Step identify the agent run and step, for operators.
	RunID string
	Step  uint32
	// RetainUntil is the business end of life (e.g. the appointment date).
	RetainUntil time.Time
	// Compensates names the SUCCEEDED operation this one reverses (e.g. the
	// charge a refund undoes); the ledger links both records. Empty for
	// none. A target that did not succeed is refused (ErrNotCompensable).
	Compensates string
	// Effect overrides the tool policy's effect (EffectUnspecified: the
	// tool policy's, then the ledger's policy).
	Effect Effect
	// IdempotencyKey is the key Attempt carries for the destination (ID when
	// empty).
	IdempotencyKey string
}

// Attempt is what fn gets for one execution of an operation.
type Attempt struct {
	// OperationID is the operation's id.
	OperationID string
	// IdempotencyKey is stable across every attempt of the operation: pass it
	// to destination APIs that honour one (Stripe's Idempotency-Key, ...), so
	// even an ambiguous attempt cannot apply the effect twice there.
	IdempotencyKey string
	// FencingToken is this attempt's token; destinations that support
	// fencing should refuse writes with older tokens.
	FencingToken uint64
	// Number is the attempt number (1 for the first claim).
	Number uint32
}

// Result is an operation's outcome: what fn returned, or what the ledger
// replayed.
type Result struct {
	// Data is the tool's result data (a JSON object).
	Data map[string]any
	// ResourceID identifies what the effect created (an appointment id...).
	ResourceID string
	// Replayed is true when the result comes from the ledger's record (an
	// earlier call's, or a reconciler's finding) rather than from fn's return
	// in this call.
	Replayed bool
	// Attempt is the attempt that produced the result.
	Attempt uint32
	// Receipt is the ledger's signed receipt of the recorded result, when
	// it signs receipts (docs/receipts.md); empty otherwise.
	Receipt string
}

// Failure is a recorded failure.
type Failure struct {
	Code    string
	Message string // shown to operators: never parameters or secrets
	// Detail is what the destination answered (final failures only),
	// returned on a replay and shown to no one.
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

// Operation is a snapshot of an operation's record.
type Operation struct {
	ID           string
	Tool         string
	Effect       Effect
	State        State
	Attempt      uint32
	FencingToken uint64
	ParamsSHA256 []byte
	PermitID     string
	RunID        string
	Step         uint32
	Result       *Result
	Failure      *Failure
	Reason       string
	NeedsReview  bool
	// Compensates is the operation this one compensates; CompensatedBy the
	// operations reserved as its compensations.
	Compensates      string
	CompensatedBy    []string
	CreatedAt        time.Time
	UpdatedAt        time.Time
	LeaseExpiresAt   time.Time
	UnknownSince     time.Time
	RecoveryDeadline time.Time
	RetainUntil      time.Time
	ExpiresAt        time.Time
	MaxAttempts      uint32
	// History is the operation's transitions, oldest first (the latest 50):
	// filled by Lookup and Reconcile, empty in every other answer.
	History []HistoryEntry
	// HistoryBase and HistoryHead are the history chain's values before the
	// first entry of History and after its last (docs/receipts.md, "The history chain"):
	// filled with History.
	HistoryBase, HistoryHead string
	// Receipt is the signed receipt the answer carried: with a ledger that
	// signs receipts, when the operation is terminal or UNKNOWN
	// (docs/receipts.md); empty otherwise.
	Receipt string
}

// lease returns the length of the claim's lease (both ends are the store's
// clock), or 0 when the snapshot has none.
func (o *Operation) lease() time.Duration {
	if o.LeaseExpiresAt.IsZero() || o.UpdatedAt.IsZero() {
		return 0
	}
	return o.LeaseExpiresAt.Sub(o.UpdatedAt)
}

// Reservation is the answer of Reserve.
type Reservation struct {
	Decision   Decision
	Operation  *Operation
	RetryAfter time.Duration // with DecisionInProgress
	Holder     string
}

// Finding is a reconciler's answer: whether the destination has the effect.
type Finding struct {
	// Kind is Applied, NotApplied, Abandon or Escalate.
	Kind FindingKind
	// Result is the effect found, with Applied.
	Result Result
	// Failure says why, with Abandon (optional).
	Failure *Failure
	// Note is kept in the operation's history; never parameters or secrets.
	// With Kind, the principal and FencingToken it makes a call a repeat of
	// an earlier one that the ledger answers without a change: a second
	// finding about an attempt already found once needs a new note.
	Note string
	// FencingToken is the token of the attempt the finding is about, from
	// the snapshot the reconciler was given (Do sets it); 0 for whichever
	// attempt is current. When another attempt holds the operation by the
	// time the finding arrives, the ledger refuses it (ErrStaleToken) and
	// changes nothing, so a late finding never resolves the next attempt.
	FencingToken uint64
}

// Reconciler asks the destination, by operation id (and what the snapshot
// says), whether the operation's effect exists. It must not apply the effect.
// Do gives it the tool's timeout (and the wait deadline): an answer that
// comes more than a second after ctx ended is not waited for, whether or
// not it comes, and is dropped.
type Reconciler func(ctx context.Context, op *Operation) (Finding, error)

// ToolPolicy is how Do treats one tool.
type ToolPolicy struct {
	// Timeout bounds each attempt of fn (a fresh timeout per attempt).
	Timeout time.Duration
	// MaxRetries is how many more attempts follow a retryable or ambiguous
	// outcome (0: the first attempt only).
	MaxRetries int
	// Effect is sent with Reserve when the Op leaves it unspecified.
	Effect Effect
}

// DefaultToolPolicy applies to tools without a policy of their own.
var DefaultToolPolicy = ToolPolicy{Timeout: 10 * time.Second, MaxRetries: 2}

// Backoff is the delay between retries: Base·2^n + rand·Base, at most Max.
// A zero Base or Max takes DefaultBackoff's.
type Backoff struct {
	Base time.Duration
	Max  time.Duration
}

// DefaultBackoff is the backoff of a new Client.
var DefaultBackoff = Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}

// Delay returns the delay before retry n (n ≥ 1).
func (b Backoff) Delay(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	if b.Base <= 0 {
		b.Base = DefaultBackoff.Base
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoff.Max
	}
	d := b.Base
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	d += time.Duration(rand.Float64() * float64(b.Base))
	return min(d, b.Max)
}

func resultFromProto(r *ledgerv1.Result) *Result {
	if r == nil {
		return nil
	}
	out := &Result{ResourceID: r.GetResourceId()}
	if r.GetData() != nil {
		out.Data = r.GetData().AsMap()
	}
	return out
}

func resultToProto(r Result) (*ledgerv1.Result, error) {
	out := &ledgerv1.Result{ResourceId: r.ResourceID}
	if r.Data != nil {
		s, err := jsonStruct(r.Data)
		if err != nil {
			return nil, err
		}
		out.Data = s
	}
	return out, nil
}

// jsonStruct converts Go values to a Struct as jsonvalue.Params does (Go
// types of their own, []string, map[string]string, tagged structs, through
// their JSON encoding), so that what is sent is what was given: an integer
// the wire's doubles would round or a string that is not valid UTF-8 is
// refused, not carried changed (a result recorded so would replay another
// resource id than the one the tool made).
func jsonStruct(m map[string]any) (*structpb.Struct, error) {
	v, err := jsonvalue.Params(m)
	if err != nil {
		return nil, err
	}
	return structpb.NewStruct(v)
}

func operationFromProto(p *ledgerv1.Operation) *Operation {
	if p == nil {
		return nil
	}
	o := &Operation{
		ID:            p.GetOperationId(),
		Tool:          p.GetTool(),
		Effect:        p.GetEffect(),
		State:         p.GetState(),
		Attempt:       p.GetAttempt(),
		FencingToken:  p.GetFencingToken(),
		ParamsSHA256:  p.GetParamsSha256(),
		PermitID:      p.GetPermitId(),
		RunID:         p.GetRunId(),
		Step:          p.GetStep(),
		Result:        resultFromProto(p.GetResult()),
		Reason:        p.GetReason(),
		NeedsReview:   p.GetNeedsReview(),
		MaxAttempts:   p.GetMaxAttempts(),
		Compensates:   p.GetCompensates(),
		CompensatedBy: p.GetCompensatedBy(),
		HistoryBase:   p.GetHistoryBase(),
		HistoryHead:   p.GetHistoryHead(),
	}
	if o.Result != nil {
		o.Result.Attempt = o.Attempt
	}
	if f := p.GetFailure(); f != nil {
		o.Failure = &Failure{Code: f.GetCode(), Message: f.GetMessage(), Detail: f.GetDetail()}
	}
	o.CreatedAt, o.UpdatedAt = ts(p.GetCreatedAt()), ts(p.GetUpdatedAt())
	o.LeaseExpiresAt, o.UnknownSince = ts(p.GetLeaseExpiresAt()), ts(p.GetUnknownSince())
	o.RecoveryDeadline, o.RetainUntil = ts(p.GetRecoveryDeadline()), ts(p.GetRetainUntil())
	o.ExpiresAt = ts(p.GetExpiresAt())
	for _, h := range p.GetHistory() {
		o.History = append(o.History, HistoryEntry{
			Time: ts(h.GetTime()), From: h.GetFromState(), To: h.GetToState(), Attempt: h.GetAttempt(),
			FencingToken: h.GetFencingToken(), Principal: h.GetPrincipal(), Reason: h.GetReason(), Detail: h.GetDetail(),
		})
	}
	return o
}

func ts(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}
