package ledger

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/opledger/ledger/fingerprint"
	"github.com/redis/go-redis/v9"
)

// Options configure a Ledger.
type Options struct {
	// Prefix is the first segment of every key (DefaultPrefix when empty):
	// letters, digits, '.', '_' and '-'.
	Prefix string
	// Policies resolve each operation's policy (DefaultPolicies when nil).
	Policies *Policies
	// Logger receives the sweeper's reports (slog.Default when nil). The
	// ledger logs ids and counts, never parameters or results.
	Logger *slog.Logger
	// UnresolvedLimit returns how many unresolved operations a tenant may
	// hold (0: no limit); nil means no limit for anyone. Reserve refuses a
	// new operation beyond it (KindQuotaExceeded), so one tenant cannot fill
	// the store. One Ledger never lets a tenant pass it; Ledgers sharing a
	// store learn of each other's operations within a second, within 10 ms
	// near the limit (docs/design.md, "The unresolved limit").
	UnresolvedLimit func(tenant string) int
	// Observer receives an Event for every script run, transition, decision
	// and refusal (nil: none), for metrics and traces.
	Observer Observer
	// WaitReplicas, when positive, makes every call of a script (every
	// write, and Lookup) wait (Redis WAIT, on the same connection, in the
	// same round trip) until that many replicas have everything the
	// primary held when the script ran, for at most WaitTimeout: what the
	// call wrote and what it read. When fewer acknowledge, the call fails
	// with KindNotReplicated: any write stands on the primary, and the same
	// call may be repeated. (Before its WAIT each call writes the shard's
	// WAIT marker, so that the wait covers the state read also when the
	// script itself wrote nothing.)
	WaitReplicas int
	// WaitTimeout bounds WAIT (100ms when zero).
	WaitTimeout time.Duration
	// NoFunctions sends every script by EVALSHA and never loads the
	// library, as on a store without Functions (docs/design.md, "How a
	// script reaches Redis").
	NoFunctions bool
}

// Ledger is the operation ledger on one Redis deployment. It is safe for
// concurrent use; many Ledgers (in many processes) may share one store.
type Ledger struct {
	rdb      redis.UniversalClient
	keys     keyspace
	policies *Policies
	log      *slog.Logger
	limit    func(tenant string) int
	quotas   quotas
	started  startedRuns
	observe  Observer
	waitN    int
	waitFor  time.Duration
	// listScan is maxListScan; the tests lower it to see short pages.
	listScan int
	// noFunctions is set once the store is found to have no Functions
	// (scripts.go): every script goes by EVALSHA from then on.
	noFunctions atomic.Bool
}

// CheckPrefix reports whether prefix may be Options.Prefix: letters,
// digits, '.', '_' and '-' only ("" is DefaultPrefix).
func CheckPrefix(prefix string) error {
	for i := 0; i < len(prefix); i++ {
		if c := prefix[i]; !unreserved(c) || c == '~' {
			return fmt.Errorf("ledger: key prefix %q: only letters, digits, '.', '_' and '-' are allowed", prefix)
		}
	}
	return nil
}

// New returns a Ledger storing its records through rdb.
func New(rdb redis.UniversalClient, opts Options) (*Ledger, error) {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := CheckPrefix(prefix); err != nil {
		return nil, err
	}
	l := &Ledger{rdb: rdb, keys: newKeyspace(prefix), policies: opts.Policies, log: opts.Logger, limit: opts.UnresolvedLimit, observe: opts.Observer,
		waitN: opts.WaitReplicas, waitFor: opts.WaitTimeout, listScan: maxListScan}
	if l.waitFor <= 0 {
		l.waitFor = 100 * time.Millisecond
	}
	l.noFunctions.Store(opts.NoFunctions)
	if l.policies == nil {
		l.policies = DefaultPolicies()
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	return l, nil
}

// Policies returns the policies the ledger applies.
func (l *Ledger) Policies() *Policies { return l.policies }

// The bounds of the retry_after suggested with DecisionInProgress: the
// remaining lease, clamped, so callers poll neither too eagerly nor too late
// for a short tool.
const (
	minRetryAfter = 50 * time.Millisecond
	maxRetryAfter = time.Second
)

// Reserve records the intent of an operation and decides how the caller
// proceeds (contract.md §4). The decision is DecisionExecute (the caller holds the
// claim: run the tool, then Complete or MarkUnknown), DecisionReplay (the
// operation ended: the snapshot holds the result or failure),
// DecisionInProgress (another holder's live claim: retry after RetryAfter)
// or DecisionReconcile (the outcome is unknown).
//
// May return an *Error of KindInvalid, KindKeyReused (Differs names tool,
// params and/or permit; for an expired operation only params, the tombstone
// keeping the fingerprint but not the tool or permit), KindKeyExpired (a late replay of an expired
// operation: State is the final state),
// KindQuotaExceeded (a new operation beyond the tenant's unresolved limit),
// KindNotCompensable (req.Compensates names an operation that is not
// SUCCEEDED; see Error.Cause) or KindUnavailable. With Compensates, the
// compensated record is linked first (one more round trip, compensate.go).
func (l *Ledger) Reserve(ctx context.Context, who Principal, req ReserveRequest) (*ReserveResult, error) {
	const op = "ledger.Reserve"
	pol := l.policies.For(who.Tenant, req.Tool)
	fp, retainMS, retainEndMS, vs := checkReserve(who, &req, &pol)
	if len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	effect := req.Effect
	if effect == EffectUnspecified {
		effect = pol.Effect
	}
	if req.Holder == "" {
		req.Holder = newHolder()
	}
	k := l.keys.op(who.Tenant, req.OperationID)
	limit := 0
	if l.limit != nil {
		limit = l.limit(who.Tenant)
	}
	comp, err := l.linkCompensation(ctx, op, who, req)
	if err != nil {
		return nil, err
	}
	adm, err := l.admitStep(ctx, op, who, req, fp, effect, pol)
	if err != nil {
		l.unlinkCompensation(ctx, comp, err)
		return nil, err
	}
	runID := adm.recordedRun(req.RunID)
	run := func(fp fingerprint.Fingerprint, fields []string) (int64, string, *record, error) {
		digest, list := fieldsDigest(fields)
		return l.reserveWithin(ctx, who.Tenant, k, limit, func(room any) (int64, string, *record, error) {
			n := newRecord{effect: effect, tool: req.Tool, permit: req.PermitID, holder: req.Holder,
				maxAttempts: pol.MaxAttempts, lease: pol.Lease, retention: pol.Retention,
				tombstone: pol.TombstoneRetention, recovery: pol.RecoveryWindow, run: runID,
				step: req.Step, retainMS: retainMS, retainEndMS: retainEndMS, fieldsDigest: digest,
				fields: list, compensates: req.Compensates, principal: who.ID}
			code, aux, rec, _, err := l.run(ctx, op, reserveScript, k, who.ID,
				req.Tool, string(fp[:]), req.PermitID, req.Holder, pol.Lease.Milliseconds(),
				req.OperationID, digest, list, room, req.Compensates, n.tail())
			return code, aux, rec, err
		})
	}
	res, err := l.reserveDecide(op, who, req, run, fp, pol)
	l.afterStep(ctx, adm, req.OperationID, res, err)
	l.unlinkCompensation(ctx, comp, err)
	return res, err
}

// checkReserve validates req under pol, and returns the fingerprint of its
// parameters and its retain_until with and without pol's grace, in Unix
// milliseconds (0 without one).
func checkReserve(who Principal, req *ReserveRequest, pol *Policy) (fp fingerprint.Fingerprint, retainMS, retainEndMS int64, vs []Violation) {
	vs = checkPrincipal(who)
	vs = append(vs, violations(
		checkID("operation_id", req.OperationID, MaxOperationIDLen, true),
		checkTool("tool", req.Tool, true),
		checkID("permit_id", req.PermitID, MaxPermitIDLen, false),
		checkID("holder", req.Holder, MaxHolderLen, false),
		checkID("run_id", req.RunID, MaxRunIDLen, false),
		checkID("compensates", req.Compensates, MaxOperationIDLen, false),
	)...)
	if req.Compensates != "" && req.Compensates == req.OperationID {
		vs = append(vs, Violation{"compensates", "an operation cannot compensate itself"})
	}
	if req.Effect > EffectIrreversible {
		vs = append(vs, Violation{"effect", "unknown effect"})
	}
	switch {
	case req.ParamsSHA256 != nil && req.Params != nil:
		vs = append(vs, Violation{"params_sha256", "set params or params_sha256, not both"})
	case req.ParamsSHA256 != nil:
		if len(req.ParamsSHA256) != len(fp) {
			vs = append(vs, Violation{"params_sha256", "must be 32 bytes (a SHA-256 digest)"})
		}
		copy(fp[:], req.ParamsSHA256)
	default:
		var err error
		if fp, err = fingerprint.Compute(req.Params, pol.ConsequentialFields); err != nil {
			vs = append(vs, Violation{"params", err.Error()})
		}
	}
	if !req.RetainUntil.IsZero() {
		if time.Until(req.RetainUntil) > MaxRetainUntil {
			vs = append(vs, Violation{"retain_until", "more than 10 years ahead"})
		}
		retainMS = req.RetainUntil.UnixMilli()
		retainEndMS = req.RetainUntil.Add(pol.RetainGrace).UnixMilli()
	}
	return fp, retainMS, retainEndMS, vs
}

// reserveDecide runs reserve.lua (again under the operation's bound
// consequential fields, when they differ from the policy's) and turns its
// answer into a result or an error.
func (l *Ledger) reserveDecide(op string, who Principal, req ReserveRequest,
	run func(fingerprint.Fingerprint, []string) (int64, string, *record, error), fp fingerprint.Fingerprint, pol Policy) (*ReserveResult, error) {
	code, aux, rec, err := run(fp, pol.ConsequentialFields)
	if err == nil && code == codeFields {
		// The operation was created under other consequential fields: compare
		// over those (a precomputed fingerprint is compared as it is).
		var bound []string
		if aux != "" {
			if jerr := json.Unmarshal([]byte(aux), &bound); jerr != nil {
				return nil, &Error{Op: op, Kind: KindOther, Err: fmt.Errorf("stored consequential fields: %w", jerr)}
			}
		}
		if req.ParamsSHA256 == nil {
			if fp, err = fingerprint.Compute(req.Params, bound); err != nil {
				return nil, invalid(op, Violation{"params", err.Error()})
			}
		}
		code, aux, rec, err = run(fp, bound)
	}
	if err != nil {
		return nil, err
	}
	switch code {
	case codeExecute, codeReplay, codeInProgress, codeReconcile:
		res := &ReserveResult{Decision: Decision(code), Operation: toOperation(req.OperationID, rec), Holder: req.Holder}
		l.emit(Event{Type: EventDecision, Op: "Reserve", Tenant: who.Tenant, Tool: req.Tool, Decision: res.Decision})
		if code == codeInProgress {
			ms, _ := strconv.ParseInt(aux, 10, 64)
			res.RetryAfter = min(max(time.Duration(ms)*time.Millisecond, minRetryAfter), maxRetryAfter)
		}
		return res, nil
	case codeKeyReused:
		mask, _ := strconv.Atoi(aux)
		var differs []string
		for i, name := range []string{"tool", "params", "permit", "compensates"} {
			if mask&(1<<i) != 0 {
				differs = append(differs, name)
			}
		}
		l.emit(Event{Type: EventConflict, Op: "Reserve", Tenant: who.Tenant, Tool: req.Tool, Differs: differs})
		return nil, &Error{Op: op, Kind: KindKeyReused, Differs: differs, Fingerprint: fp}
	}
	return nil, l.codeError(op, who.Tenant, req.OperationID, code, aux, rec)
}

// Complete records how the claimed attempt with req.FencingToken ended:
// OutcomeSucceeded (with Result) or OutcomeFailedFinal make the operation
// terminal; OutcomeFailedRetryable (proven not applied) returns it to
// PENDING. It is accepted from RUNNING, from UNKNOWN and from PENDING while
// the token is the latest; a repeat with the same token and outcome succeeds
// again.
//
// May return an *Error of KindInvalid, KindStaleToken, KindCompletionConflict
// (another outcome is recorded), KindNotFound, KindKeyExpired or
// KindUnavailable.
func (l *Ledger) Complete(ctx context.Context, who Principal, req CompleteRequest) (*Operation, error) {
	const op = "ledger.Complete"
	vs := l.checkClaim(who, req.OperationID, req.FencingToken)
	switch req.Outcome {
	case OutcomeSucceeded:
		if req.Failure != nil {
			vs = append(vs, Violation{"failure", "only with a failure outcome"})
		}
	case OutcomeFailedFinal, OutcomeFailedRetryable:
		if req.Result != nil {
			vs = append(vs, Violation{"result", "only with OUTCOME_SUCCEEDED"})
		}
		if req.Outcome == OutcomeFailedRetryable && req.Failure != nil && req.Failure.Detail != "" {
			vs = append(vs, Violation{"failure.detail", "only with OUTCOME_FAILED_FINAL"})
		}
	default:
		vs = append(vs, Violation{"outcome", "required: SUCCEEDED, FAILED_FINAL or FAILED_RETRYABLE"})
	}
	vs = append(vs, checkResult("result", req.Result)...)
	vs = append(vs, checkFailure("failure", req.Failure)...)
	if len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	r, f := storedOutcome(req.Result, req.Failure)
	o, err := l.update(ctx, op, completeScript, who, req.OperationID,
		req.FencingToken, int(req.Outcome), outcomeDigest(req.Outcome, r, f),
		r.Data, r.ResourceID, f.Code, f.Message, req.OperationID)
	if err == nil {
		l.settleOperation(ctx, who.Tenant, o)
	}
	return o, err
}

// MarkUnknown records that the claimed attempt with req.FencingToken cannot
// tell whether the effect happened: the operation becomes UNKNOWN (reason
// MARKED_UNKNOWN). A terminal operation is returned unchanged; a repeat
// succeeds again.
//
// May return an *Error of KindInvalid, KindStaleToken, KindCompletionConflict
// (this attempt already reported a retryable failure), KindNotFound,
// KindKeyExpired or KindUnavailable.
func (l *Ledger) MarkUnknown(ctx context.Context, who Principal, req MarkUnknownRequest) (*Operation, error) {
	const op = "ledger.MarkUnknown"
	vs := l.checkClaim(who, req.OperationID, req.FencingToken)
	vs = append(vs, violations(checkText("reason", req.Reason, MaxNoteLen))...)
	if len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	return l.update(ctx, op, markUnknownScript, who, req.OperationID, req.FencingToken, req.Reason)
}

// Renew extends the lease of the running claim with req.FencingToken by the
// policy's lease, from the store's current time.
//
// May return an *Error of KindInvalid, KindStaleToken (the claim is gone:
// another attempt, another state, or the lease already expired),
// KindNotFound, KindKeyExpired or KindUnavailable.
func (l *Ledger) Renew(ctx context.Context, who Principal, req RenewRequest) (*Operation, error) {
	const op = "ledger.Renew"
	if vs := l.checkClaim(who, req.OperationID, req.FencingToken); len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	return l.update(ctx, op, renewScript, who, req.OperationID, req.FencingToken)
}

// Reconcile resolves an operation from what the destination says:
// FindingApplied → SUCCEEDED with req.Result; FindingNotApplied → PENDING;
// FindingAbandon → FAILED_FINAL; FindingEscalate → UNKNOWN flagged for
// review. It is accepted from UNKNOWN, RUNNING past its lease and PENDING.
// With req.FencingToken, a finding about an attempt that is no longer
// current is refused. A repeat of a call that took effect returns the
// record and changes nothing; on a terminal record only the finding that
// matches the outcome that stands is such a repeat (docs/design.md §3.3,
// reconcile.lua). The record returned carries its history.
//
// May return an *Error of KindInvalid, KindInProgress (a live lease; see
// RetryAfter), KindAlreadyResolved, KindStaleToken, KindNotFound,
// KindKeyExpired or KindUnavailable.
func (l *Ledger) Reconcile(ctx context.Context, who Principal, req ReconcileRequest) (*Operation, error) {
	const op = "ledger.Reconcile"
	vs := checkPrincipal(who)
	vs = append(vs, violations(
		checkID("operation_id", req.OperationID, MaxOperationIDLen, true),
		checkText("note", req.Note, MaxNoteLen),
	)...)
	switch req.Finding {
	case FindingApplied, FindingNotApplied, FindingAbandon, FindingEscalate:
	default:
		vs = append(vs, Violation{"finding", "required: APPLIED, NOT_APPLIED, ABANDON or ESCALATE"})
	}
	if req.Result != nil && req.Finding != FindingApplied {
		vs = append(vs, Violation{"result", "only with FINDING_APPLIED"})
	}
	if req.Failure != nil && req.Finding != FindingAbandon {
		vs = append(vs, Violation{"failure", "only with FINDING_ABANDON"})
	}
	if req.Failure != nil && req.Failure.Detail != "" {
		vs = append(vs, Violation{"failure.detail", "only with Complete's OUTCOME_FAILED_FINAL"})
	}
	vs = append(vs, checkResult("result", req.Result)...)
	vs = append(vs, checkFailure("failure", req.Failure)...)
	if len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	r, f := derefResult(req.Result), derefFailure(req.Failure)
	token := ""
	if req.FencingToken != 0 {
		token = strconv.FormatUint(req.FencingToken, 10)
	}
	// The script's reply is the whole stored record, history included: the
	// snapshot carries it at no extra round trip.
	code, aux, rec, _, err := l.run(ctx, op, reconcileScript, l.keys.op(who.Tenant, req.OperationID), who.ID,
		int(req.Finding), r.Data, r.ResourceID, f.Code, f.Message, req.Note, token)
	if code == codeOK && rec != nil && rec.op != nil && rec.moved {
		// The finding is recorded: reported once, by the call whose script
		// recorded it, also when the call then fails (NOT_REPLICATED, the
		// WAIT marker refused), as run reports its transition. A repeat of
		// a finding that stands is answered OK and records nothing.
		l.emit(Event{Type: EventReconciled, Op: "Reconcile", Tenant: who.Tenant, Tool: rec.op.Tool, Finding: req.Finding})
	}
	if err != nil {
		return nil, err
	}
	if code != codeOK {
		return nil, l.codeError(op, who.Tenant, req.OperationID, code, aux, rec)
	}
	o := toOperation(req.OperationID, rec)
	o.History = parseHistory(rec.history, o.CreatedAt)
	l.settleOperation(ctx, who.Tenant, o)
	return o, nil
}

// Lookup reads one operation with its history. With Options.WaitReplicas it
// answers only once the replicas have the state it read (KindNotReplicated
// otherwise), as a write does.
//
// May return an *Error of KindInvalid, KindNotFound, KindKeyExpired (State is
// the final state), KindNotReplicated or KindUnavailable.
func (l *Ledger) Lookup(ctx context.Context, who Principal, id string) (*Operation, error) {
	const op = "ledger.Lookup"
	vs := checkPrincipal(who)
	vs = append(vs, violations(checkID("operation_id", id, MaxOperationIDLen, true))...)
	if len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	k := l.keys.op(who.Tenant, id)
	code, aux, rec, _, err := l.runKeys(ctx, op, lookupScript, l.waitMarker(k), k.all[:1], who.ID, k.member)
	if err != nil {
		return nil, err
	}
	if code != codeOK {
		return nil, l.codeError(op, who.Tenant, id, code, aux, rec)
	}
	o := toOperation(id, rec)
	o.History = parseHistory(rec.history, o.CreatedAt)
	return o, nil
}

// update runs a write script whose only success is codeOK and returns the
// record after it.
func (l *Ledger) update(ctx context.Context, op string, s *script, who Principal, id string, args ...any) (*Operation, error) {
	code, aux, rec, _, err := l.run(ctx, op, s, l.keys.op(who.Tenant, id), who.ID, args...)
	if err != nil {
		return nil, err
	}
	if code != codeOK {
		return nil, l.codeError(op, who.Tenant, id, code, aux, rec)
	}
	return toOperation(id, rec), nil
}

func (l *Ledger) checkClaim(who Principal, id string, token uint64) []Violation {
	vs := checkPrincipal(who)
	vs = append(vs, violations(checkID("operation_id", id, MaxOperationIDLen, true))...)
	if token == 0 {
		vs = append(vs, Violation{"fencing_token", "required: the token of the EXECUTE decision"})
	}
	return vs
}

// run runs a write script on an operation's five keys with the principal and
// lease member as ARGV[1..2], followed by args. It reports the transition
// the script made whenever the script ran, also when the call then fails
// (KindNotReplicated, or the WAIT marker's write or WAIT refused after the
// script): the transition stands in the store, and the caller's repeat
// will not make it again.
func (l *Ledger) run(ctx context.Context, op string, s *script, k opKeys, principal string, args ...any) (int64, string, *record, []any, error) {
	code, aux, rec, extra, err := l.runKeys(ctx, op, s, l.waitMarker(k), k.all, principal, k.member, args...)
	l.transitionEvent(strings.TrimPrefix(op, "ledger."), k.tenant, rec)
	return code, aux, rec, extra, err
}

// waitMarker returns the key eval writes before its WAIT for a call on the
// operation k, or "" when no replicas are required (no WAIT).
func (l *Ledger) waitMarker(k opKeys) string {
	if l.waitN <= 0 {
		return ""
	}
	return l.keys.wait(k.shard)
}

// eval runs a script: EVALSHA with the EVAL fallback, and when marker is
// set (replicas are required), a write of marker and WAIT on the same
// connection in the same round trip. It returns the script's reply, and
// when fewer replicas acknowledged, the reply with a *Error of
// KindNotReplicated. When the script ran and the marker's write or WAIT
// then failed, it returns the reply with that error; a reply is returned
// only when the script ran.
func (l *Ledger) eval(ctx context.Context, op string, s *script, marker string, keys []string, args []any) ([]any, error) {
	if marker == "" {
		return l.call(ctx, l.rdb, s, keys, args)
	}
	cc, cluster := l.rdb.(*redis.ClusterClient)
	for try := 0; ; try++ {
		var c redis.Cmdable = l.rdb
		if cluster {
			// WAIT counts the replicas of the connection's node, so the
			// script goes to the slot's master directly, not through the
			// cluster client's redirections.
			node, err := cc.MasterForKey(ctx, keys[0])
			if err != nil {
				return nil, err
			}
			c = node
		}
		res, ran, err := l.evalWait(ctx, op, c, s, marker, keys, args)
		if !cluster || try == 3 || ran || !movedError(err) {
			// A redirection of the marker's SET after the script ran (the
			// slot closed between the two) is not the script's: sent again,
			// the script would run twice.
			return res, err
		}
		// The slot moved (a failover, a resharding) and the cached slot map
		// is behind: a script answered MOVED or ASK did not run. Reload the
		// map and go to the new master.
		cc.ReloadState(ctx)
		t := time.NewTimer(time.Duration(50<<try) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// evalWait runs a script, a write of marker and WAIT in one pipeline on c's
// connection (EVAL when the node does not know the script). The marker's
// write makes WAIT cover the state the script read, also when the script
// wrote nothing (failure-model.md §7). ran reports whether the script ran:
// res is then its reply, also with an error of the marker or WAIT after it
// (a resharding may close the slot between them).
func (l *Ledger) evalWait(ctx context.Context, op string, c redis.Cmdable, s *script, marker string, keys []string, args []any) (res []any, ran bool, err error) {
	once := func(by way) ([]any, int64, error) {
		pipe := c.Pipeline() // one connection: WAIT covers the marker's write
		ev := s.send(ctx, pipe, by, keys, args)
		mark := pipe.Set(ctx, marker, "1", 0)
		w := redis.NewIntCmd(ctx, "wait", l.waitN, l.waitFor.Milliseconds())
		_ = pipe.Process(ctx, w)
		_, _ = pipe.Exec(ctx)
		res, err := ev.Slice()
		if err != nil {
			return nil, 0, err
		}
		ran = true
		if err := mark.Err(); err != nil {
			// Refused (read-only after a failover, out of memory, the slot
			// moved since the script ran): nothing says the replicas have
			// what the script read. What the script did stands: the
			// reply goes back with the error.
			return res, 0, err
		}
		return res, w.Val(), w.Err()
	}
	var acked int64
	l.try(ctx, func(w way) error {
		res, acked, err = once(w)
		if ran {
			return nil // what the script did stands, whatever came after it
		}
		return err
	})
	if err != nil {
		return res, ran, err
	}
	if acked < int64(l.waitN) {
		return res, true, &Error{Op: op, Kind: KindNotReplicated, Replicas: int(acked), Err: fmt.Errorf("%d of %d replicas acknowledged within %s", acked, l.waitN, l.waitFor)}
	}
	return res, true, nil
}

// movedError reports a Redis Cluster redirection: the node no longer (or not
// yet) serves the key's slot.
func movedError(err error) bool {
	return redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")
}

// runKeys runs script s on keys with ARGV principal, member, args..., and
// splits its reply: code, aux, the record (nil when the script returned
// none) and any further values. With a marker (waitMarker) the call waits
// for the replicas (eval). When the script ran and the call then failed
// (KindNotReplicated, or the marker's write or WAIT refused after the
// script), the split reply comes with the error, so that the caller can
// report what the script did; the record is nil whenever the script did
// not run.
func (l *Ledger) runKeys(ctx context.Context, op string, s *script, marker string, keys []string, principal, member string, args ...any) (int64, string, *record, []any, error) {
	// ARGV is principal, member, args: built once (go-redis copies it once
	// more into the command).
	argv := make([]any, 0, 2+len(args))
	argv = append(argv, principal, member)
	raw, err := l.evalReported(ctx, op, s, marker, keys, append(argv, args...))
	var failed error // the store's error, also after a script that ran
	if err != nil && KindOf(err) != KindNotReplicated {
		failed = err
		if raw == nil { // the script did not run
			return 0, "", nil, nil, err
		}
	}
	// A reply that cannot be read is KindOther, unless the store failed
	// the call anyway: its error stands.
	unreadable := func(e error) error {
		if failed != nil {
			return failed
		}
		return &Error{Op: op, Kind: KindOther, Err: e}
	}
	if len(raw) < 3 {
		return 0, "", nil, nil, unreadable(fmt.Errorf("script returned %d values", len(raw)))
	}
	code, _ := raw[0].(int64)
	aux, _ := raw[1].(string)
	rec, rerr := recordFromReply(raw)
	if rerr != nil {
		return 0, "", nil, nil, unreadable(rerr)
	}
	return code, aux, rec, raw[3:], err
}

// evalReported runs a script as eval does and reports it to the observer
// (EventScript). A store error is returned as a ledger error, with the
// reply when the script ran.
func (l *Ledger) evalReported(ctx context.Context, op string, s *script, marker string, keys []string, argv []any) ([]any, error) {
	start := time.Now()
	raw, err := l.eval(ctx, op, s, marker, keys, argv)
	return raw, l.reported(op, start, err)
}

// reported reports a store call of op, begun at start and ended with err,
// to the observer (EventScript), and returns err as a ledger error.
func (l *Ledger) reported(op string, start time.Time, err error) error {
	ev := Event{Type: EventScript, Op: strings.TrimPrefix(op, "ledger.")}
	if err != nil && KindOf(err) != KindNotReplicated {
		err = storeError(op, err)
		ev.Failed, ev.ErrKind = true, KindOf(err)
	}
	ev.Duration = time.Since(start)
	l.emit(ev)
	return err
}

// codeError turns a script's error code into an *Error.
func (l *Ledger) codeError(op, tenant, id string, code int64, aux string, rec *record) error {
	e := &Error{Op: op}
	switch code {
	case codeNotFound:
		e.Kind = KindNotFound
	case codeExpired:
		e.Kind = KindKeyExpired
		st, head, _ := strings.Cut(aux, ":")
		e.State, e.HistoryHead = parseState(st), head
	case codeStale:
		e.Kind = KindStaleToken
		e.State = parseState(aux)
	case codeCompletionConflict:
		e.Kind = KindCompletionConflict
	case codeAlreadyResolved:
		e.Kind = KindAlreadyResolved
	case codeQuota:
		e.Kind = KindQuotaExceeded
	case codeBusy:
		e.Kind = KindInProgress
		ms, _ := strconv.ParseInt(aux, 10, 64)
		e.RetryAfter = time.Duration(ms) * time.Millisecond
	default:
		return &Error{Op: op, Kind: KindOther, Err: fmt.Errorf("unexpected script code %d", code)}
	}
	if rec != nil && rec.op != nil {
		e.Operation = toOperation(id, rec)
		if e.State == StateUnspecified {
			e.State = e.Operation.State
		}
	}
	if e.Kind != KindNotFound {
		ev := Event{Type: EventRefused, Op: strings.TrimPrefix(op, "ledger."), Tenant: tenant, ErrKind: e.Kind}
		if e.Operation != nil {
			ev.Tool = e.Operation.Tool
		}
		l.emit(ev)
	}
	return e
}

// storeError classifies an error from the store: unreachable, timed out or
// refusing writes (OOM under maxmemory, read-only replica, loading, cluster
// down) is KindUnavailable, and the caller may retry the same call; anything
// else (a script error) is KindOther.
func storeError(op string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && !errors.Is(err, redis.ErrClosed) {
		msg := rerr.Error()
		for _, p := range []string{"OOM", "READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS", "BUSY", "MOVED", "ASK"} {
			if strings.HasPrefix(msg, p) {
				return &Error{Op: op, Kind: KindUnavailable, Err: err}
			}
		}
		return &Error{Op: op, Kind: KindOther, Err: err}
	}
	return &Error{Op: op, Kind: KindUnavailable, Err: err}
}

func derefResult(r *Result) Result {
	if r == nil {
		return Result{}
	}
	return *r
}

func derefFailure(f *Failure) Failure {
	if f == nil {
		return Failure{}
	}
	return *f
}

// storedOutcome returns a Complete's result and failure as the record
// stores them: a final failure's detail where a result's data is.
func storedOutcome(r *Result, f *Failure) (Result, Failure) {
	sr, sf := derefResult(r), derefFailure(f)
	if sf.Detail != "" {
		sr.Data = []byte(sf.Detail)
	}
	return sr, sf
}

// fieldsDigest identifies a list of consequential fields: a digest and the
// JSON list, both empty when the fingerprint covers every parameter.
func fieldsDigest(fields []string) (string, string) {
	if len(fields) == 0 {
		return "", ""
	}
	b, _ := json.Marshal(fields)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), string(b)
}

func newHolder() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "ledger-" + hex.EncodeToString(b[:])
}
