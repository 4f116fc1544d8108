package ledger

import "time"

// EventType says what an Event reports.
type EventType uint8

// The events the ledger reports to its Observer.
const (
	// EventScript: one script (or read) ran against the store: Op, Duration,
	// and, when it failed, Failed and ErrKind (KindUnavailable for the
	// store's errors, KindOther for a script error).
	EventScript EventType = iota + 1
	// EventTransition: an operation changed state: Tenant, Tool, Effect,
	// From (StateUnspecified for a new record), To, Reason, Attempt, and
	// Dwell, the time it spent in From.
	EventTransition
	// EventDecision: Reserve decided (Tenant, Tool, Decision).
	EventDecision
	// EventConflict: Reserve refused a changed request (Tenant, Tool as
	// requested, Differs).
	EventConflict
	// EventRefused: a call was refused for a reason of the state machine
	// (Op, Tenant, ErrKind: KindStaleToken, KindCompletionConflict,
	// KindAlreadyResolved, KindInProgress, KindKeyExpired, KindQuotaExceeded).
	EventRefused
	// EventReconciled: Reconcile recorded a finding (Tenant, Tool, Finding).
	EventReconciled
	// EventCompacted: the compaction pass cut Count terminal records past
	// their retention to their tombstone (Op "Compact").
	EventCompacted
	// EventCompactionPass: the compaction pass's walk over one master's
	// keys reached the end of the keyspace: every record key there was
	// looked at once (Op "Compact").
	EventCompactionPass
	// EventRunEnded: a run ended (Op, Tenant, RunState, Count: its steps).
	EventRunEnded
)

// Event is one thing the ledger did, for metrics and traces. It carries ids,
// states and names, never parameters or results.
type Event struct {
	Type     EventType
	Op       string // "Reserve", "Complete", ..., "Sweep"
	Tenant   string
	Tool     string
	Effect   Effect
	From, To State
	Reason   string
	Attempt  uint32
	Dwell    time.Duration
	Decision Decision
	Differs  []string
	Finding  Finding
	ErrKind  Kind
	RunState RunState // EventRunEnded; EventRefused with KindRunEnded
	Failed   bool
	Duration time.Duration
	Count    int // EventCompacted: how many records; EventRunEnded: steps
}

// Observer receives the ledger's events. It is called synchronously on the
// request path: it must be cheap and must not block.
type Observer func(Event)

func (l *Ledger) emit(e Event) {
	if l.observe != nil {
		l.observe(e)
	}
}

// transitionEvent reports the transition a script made, if it made one.
func (l *Ledger) transitionEvent(op, tenant string, rec *record) {
	if rec == nil || !rec.moved || rec.op == nil || l.observe == nil {
		return
	}
	o := rec.op
	l.observe(Event{
		Type: EventTransition, Op: op, Tenant: tenant, Tool: o.Tool,
		Effect: o.Effect, From: rec.from, To: o.State,
		Reason: o.Reason, Attempt: o.Attempt, Dwell: rec.dwell,
	})
}
