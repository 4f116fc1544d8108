package faults

import (
	"fmt"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// This file is a sequential model of one operation's record, written from
// contract.md §4 and the transition tables of docs/design.md §3.3, for
// porcupine; a history is checked one operation id at a time. It is
// nondeterministic where the clients cannot see (a lease ending, the
// sweeper, a claim's token, a call whose outcome was lost), and recognises
// a repeated call as the scripts do (failure-model.md §2).

// kind is which RPC a call is.
type kind uint8

const (
	kReserve kind = iota + 1
	kComplete
	kMarkUnknown
	kRenew
	kReconcile
	kLookup
)

var kindNames = map[kind]string{kReserve: "Reserve", kComplete: "Complete", kMarkUnknown: "MarkUnknown",
	kRenew: "Renew", kReconcile: "Reconcile", kLookup: "Lookup"}

// States, decisions, outcomes, findings and effects, as on the wire.
const (
	stPending   = 1
	stRunning   = 2
	stSucceeded = 3
	stFailed    = 4
	stUnknown   = 5

	decExecute    = 1
	decReplay     = 2
	decInProgress = 3
	decReconcile  = 4

	outSucceeded = 1
	outFinal     = 2
	outRetryable = 3

	findApplied    = 1
	findNotApplied = 2
	findAbandon    = 3
	findEscalate   = 4

	effIdempotent   = 2
	effIrreversible = 3
)

var stateNames = map[int]string{0: "-", stPending: "PENDING", stRunning: "RUNNING", stSucceeded: "SUCCEEDED", stFailed: "FAILED_FINAL", stUnknown: "UNKNOWN"}
var decisionNames = map[int]string{decExecute: "EXECUTE", decReplay: "REPLAY", decInProgress: "IN_PROGRESS", decReconcile: "RECONCILE"}

// input is one ledger call as the client sent it.
type input struct {
	Kind    kind
	ID      string
	Holder  string // Reserve
	Effect  int    // Reserve: the effect the operation is bound to on creation
	Max     uint32 // Reserve: the policy's max attempts, bound on creation
	Token   uint64 // Complete, MarkUnknown, Renew, Reconcile (0: unfenced)
	Outcome int    // Complete
	Finding int    // Reconcile
	// Principal and Note of a Reconcile: who made the finding (the
	// server's principal of the caller) and its note.
	Principal string
	Note      string
	// Digest identifies a Complete's outcome (outcome, result, failure), as
	// the ledger's cdg does; RID and Data are the resource id and the data
	// (canonical JSON) of a result (Complete SUCCEEDED, Reconcile APPLIED);
	// Code and Msg the failure code and message (Complete failures,
	// Reconcile ABANDON).
	Digest string
	RID    string
	Data   string
	Code   string
	Msg    string
}

// output is what the client got back.
type output struct {
	// Unknown: the call ended without telling whether it took effect; Why
	// is its error's reason (not compared).
	Unknown bool
	Why     string
	// Err is the ErrorInfo reason of a definite refusal ("" on success).
	Err string
	// Decision of a Reserve; the snapshot of the record after the call.
	Decision int
	HasOp    bool
	State    int
	Attempt  uint32
	Token    uint64
	RID      string // the result's resource id, when SUCCEEDED
	// Reason of the record's latest transition (not compared: the loss
	// check of the fault tests reads it).
	Reason string
}

// record is the model's state of one operation. It is a comparable value.
type record struct {
	Exists bool
	St     int
	Att    uint32
	Tok    uint64 // 0 while not yet seen (see TokLo)
	TokLo  uint64 // when Tok is 0: the token is larger than this
	Hld    string
	Ended  bool // a RUNNING claim whose lease has ended
	Ctk    uint64
	Cdg    string
	Rsn    string
	Rev    bool
	RID    string
	Data   string // the result's data (canonical JSON)
	Code   string
	Msg    string // the failure's message
	Eff    int
	Max    uint32
	// Toks are the pinned tokens of earlier attempts (index: attempt), and
	// the bit sets (bit: attempt) of the transitions a repeat of Complete
	// (retryable) or MarkUnknown recognises.
	Toks            [maxModelAttempts + 1]uint64
	Retried, Marked uint64
	// Findings are the NOT_APPLIED and ESCALATE findings the history holds,
	// one finding entry a line, sorted (so that equal sets are equal
	// strings).
	Findings string
}

// maxModelAttempts bounds the attempts whose tokens the model remembers.
const maxModelAttempts = 40

// earlier returns the earlier attempt whose pinned token is t (0 when
// none is).
func (r record) earlier(t uint64) uint32 {
	for a := uint32(1); a < r.Att && a <= maxModelAttempts; a++ {
		if r.Toks[a] == t && t != 0 {
			return a
		}
	}
	return 0
}

// did reports whether the attempt that held token t made a transition of
// the set bits.
func (r record) did(t uint64, bits uint64) bool {
	a := r.earlier(t)
	return a != 0 && bits&(1<<a) != 0
}

// finding is the entry of Reconcile call in's finding about attempt att
// in record.Findings.
func finding(att uint32, in input) string {
	return fmt.Sprintf("%d %s", att, findingOf(in))
}

// findingOf is the part of a finding entry after the attempt.
func findingOf(in input) string {
	return fmt.Sprintf("%d %q %q", in.Finding, in.Principal, in.Note)
}

// found reports whether the history holds in's finding, by its principal
// with its note, about attempt att, or about any attempt when att is 0:
// reconcile.lua's did() with a token, or without one.
func (r record) found(att uint32, in input) bool {
	want := findingOf(in)
	for _, e := range strings.Split(r.Findings, "\n") {
		a, f, _ := strings.Cut(e, " ")
		if f == want && (att == 0 || a == fmt.Sprint(att)) {
			return true
		}
	}
	return false
}

// addFinding adds in's finding about the current attempt to r.Findings.
func (r *record) addFinding(in input) {
	e := finding(r.Att, in)
	if r.Findings == "" {
		r.Findings = e
		return
	}
	all := strings.Split(r.Findings, "\n")
	if i := sort.SearchStrings(all, e); i == len(all) || all[i] != e {
		all = append(all[:i], append([]string{e}, all[i:]...)...)
	}
	r.Findings = strings.Join(all, "\n")
}

// mark sets the current attempt's bit in *bits.
func (r *record) mark(bits *uint64) {
	if r.Att <= maxModelAttempts {
		*bits |= 1 << r.Att
	}
}

func (r record) terminal() bool { return r.St == stSucceeded || r.St == stFailed }

func (r record) String() string {
	if !r.Exists {
		return "none"
	}
	tok := fmt.Sprint(r.Tok)
	if r.Tok == 0 {
		tok = fmt.Sprintf(">%d", r.TokLo)
	}
	s := fmt.Sprintf("%s a%d t%s", stateNames[r.St], r.Att, tok)
	if r.St == stRunning {
		s += " h=" + short(r.Hld)
		if r.Ended {
			s += " (lease ended)"
		}
	}
	if r.RID != "" {
		s += " rid=" + r.RID
	}
	if r.Data != "" {
		s += " data=" + r.Data
	}
	if r.Code != "" {
		s += fmt.Sprintf(" failure=%s %q", r.Code, r.Msg)
	}
	if r.Rev {
		s += " review"
	}
	return s
}

func short(s string) string {
	if len(s) > 8 {
		return s[len(s)-6:]
	}
	return s
}

// result is one way a call can go from a state: the record after it and
// the answer it gives.
type result struct {
	next record
	err  string
	dec  int
	snap bool // the answer carries the record (next) to compare
}

// spontaneous returns the states a record can reach without any call: a
// live lease ends; an ended irreversible claim is swept to UNKNOWN.
func spontaneous(r record) []record {
	out := []record{r}
	if r.Exists && r.St == stRunning {
		if !r.Ended {
			e := r
			e.Ended = true
			out = append(out, e)
		}
		if r.Eff == effIrreversible {
			out = append(out, toUnknown(r, "LEASE_EXPIRED"))
		}
	}
	return out
}

// toUnknown is transition(UNKNOWN, reason).
func toUnknown(r record, reason string) record {
	r.St, r.Rsn, r.Hld, r.Ended = stUnknown, reason, "", false
	return r
}

// claim is reserve.lua's claim(): a new attempt with a new, larger token.
func claim(r record, holder string) record {
	lo := r.Tok
	if lo == 0 {
		lo = r.TokLo
	}
	if r.Att >= 1 && r.Att <= maxModelAttempts {
		r.Toks[r.Att] = r.Tok
	}
	r.Att++
	r.Tok, r.TokLo = 0, lo
	r.St, r.Hld, r.Ended = stRunning, holder, false
	r.RID, r.Data, r.Code, r.Msg, r.Rev = "", "", "", "", false
	return r
}

// tokens returns the ways a call carrying token t can relate to the record:
// it is the current token (the record with the token pinned) and/or it is
// not. With a token not yet seen, both may be true.
func tokens(r record, t uint64) (cur []record, stale bool) {
	switch {
	case r.Tok != 0:
		if r.Tok == t {
			return []record{r}, false
		}
		return nil, true
	case t > r.TokLo:
		p := r
		p.Tok = t
		return []record{p}, true
	}
	return nil, true
}

// apply returns the ways call in can go from record r (contract.md §4; design.md
// §3.3).
func apply(r record, in input) []result {
	ok := func(n record) result { return result{next: n, snap: true} }
	refuse := func(n record, reason string) result { return result{next: n, err: reason} }
	if in.Kind != kReserve && !r.Exists {
		return []result{refuse(r, "NOT_FOUND")}
	}
	switch in.Kind {
	case kLookup:
		return []result{ok(r)}

	case kReserve:
		dec := func(n record, d int) result { return result{next: n, dec: d, snap: true} }
		exhausted := r.Att >= r.Max
		switch {
		case !r.Exists:
			n := claim(record{Exists: true, Eff: in.Effect, Max: in.Max}, in.Holder)
			n.Rsn = "RESERVED"
			return []result{dec(n, decExecute)}
		case r.terminal():
			return []result{dec(r, decReplay)}
		case r.St == stPending && exhausted:
			n := r
			n.St, n.Rsn, n.RID, n.Data = stFailed, "RETRIES_EXHAUSTED", "", ""
			n.Code, n.Msg = "RETRIES_EXHAUSTED", fmt.Sprintf("the policy allows %d attempts", r.Max)
			return []result{dec(n, decReplay)}
		case r.St == stPending:
			return []result{dec(claim(r, in.Holder), decExecute)}
		case r.St == stRunning && !r.Ended:
			if r.Hld == in.Holder {
				return []result{dec(r, decExecute)}
			}
			return []result{dec(r, decInProgress)}
		case r.St == stRunning && r.Eff == effIrreversible:
			return []result{dec(toUnknown(r, "LEASE_EXPIRED"), decReconcile)}
		case r.St == stRunning && exhausted:
			return []result{dec(toUnknown(r, "RETRIES_EXHAUSTED"), decReconcile)}
		case r.St == stRunning:
			return []result{dec(claim(r, in.Holder), decExecute)}
		case r.Eff == effIrreversible || exhausted || r.Rev: // UNKNOWN
			return []result{dec(r, decReconcile)}
		default:
			return []result{dec(claim(r, in.Holder), decExecute)}
		}

	case kComplete, kMarkUnknown, kRenew:
		cur, stale := tokens(r, in.Token)
		var out []result
		if stale {
			switch {
			case in.Kind == kComplete && in.Outcome == outRetryable && r.did(in.Token, r.Retried),
				in.Kind == kMarkUnknown && r.did(in.Token, r.Marked):
				out = append(out, ok(r)) // a repeat after the record moved on
			default:
				out = append(out, refuse(r, "STALE_FENCING_TOKEN"))
			}
		}
		for _, c := range cur {
			switch in.Kind {
			case kComplete:
				out = append(out, complete(c, in))
			case kMarkUnknown:
				out = append(out, markUnknown(c, in))
			case kRenew:
				out = append(out, renew(c))
			}
		}
		return out

	case kReconcile:
		// In reconcile.lua's order: a terminal record; a repeat; a token
		// that is not the current one; the finding.
		if r.terminal() {
			// A NOT_APPLIED or ESCALATE that took effect before the
			// operation went terminal, repeated: OK, nothing changes.
			if in.Finding == findNotApplied || in.Finding == findEscalate {
				switch a := r.earlier(in.Token); {
				case in.Token == 0 && r.found(r.Att, in), a != 0 && r.found(a, in),
					r.Tok != 0 && r.Tok == in.Token && r.found(r.Att, in):
					return []result{ok(r)}
				case r.Tok == 0 && in.Token > r.TokLo && r.found(r.Att, in):
					// The token may be the current attempt's, which the
					// history has not pinned.
					return []result{ok(r), reconcile(r, in)}
				}
			}
			return []result{reconcile(r, in)}
		}
		if in.Token == 0 {
			switch {
			case r.found(r.Att, in):
				return []result{ok(r)}
			case r.found(0, in): // about an earlier attempt only
				return []result{refuse(r, "STALE_FENCING_TOKEN")}
			}
			return []result{reconcile(r, in)}
		}
		cur, stale := tokens(r, in.Token)
		var out []result
		if stale {
			if a := r.earlier(in.Token); a != 0 && r.found(a, in) {
				out = append(out, ok(r))
			} else {
				out = append(out, refuse(r, "STALE_FENCING_TOKEN"))
			}
		}
		for _, c := range cur {
			if c.found(c.Att, in) {
				out = append(out, ok(c))
			} else {
				out = append(out, reconcile(c, in))
			}
		}
		return out
	}
	return nil
}

func complete(r record, in input) result {
	ok := func(n record) result { return result{next: n, snap: true} }
	conflict := result{next: r, err: "COMPLETION_CONFLICT"}
	if r.Ctk == in.Token {
		if r.Cdg == in.Digest {
			return ok(r)
		}
		return conflict
	}
	switch r.St {
	case stSucceeded:
		if in.Outcome == outSucceeded {
			return ok(r)
		}
		return conflict
	case stFailed:
		if in.Outcome == outFinal {
			return ok(r)
		}
		if in.Outcome == outSucceeded && (r.Rsn == "RETRIES_EXHAUSTED" || r.Rsn == "ABANDONED") {
			n := r
			n.Ctk, n.Cdg = in.Token, in.Digest
			n.St, n.Rsn, n.RID, n.Data, n.Code, n.Msg = stSucceeded, "SUCCEEDED", in.RID, in.Data, "", ""
			return ok(n)
		}
		return conflict
	}
	n := r
	n.Ctk, n.Cdg = in.Token, in.Digest
	n.RID, n.Data, n.Code, n.Msg = in.RID, in.Data, in.Code, in.Msg
	switch {
	case in.Outcome == outSucceeded:
		n.St, n.Rsn, n.Code, n.Msg = stSucceeded, "SUCCEEDED", "", ""
	case in.Outcome == outFinal:
		n.St, n.Rsn, n.RID, n.Data = stFailed, "FAILED_FINAL", "", ""
	case r.St == stPending:
		n.RID, n.Data = "", ""
	default:
		n.St, n.Rsn, n.RID, n.Data = stPending, "FAILED_RETRYABLE", "", ""
		n.mark(&n.Retried)
	}
	n.Hld, n.Ended, n.Rev = "", false, false
	return ok(n)
}

// markUnknown is mark_unknown.lua for the current attempt's token.
func markUnknown(r record, in input) result {
	switch {
	case r.Att <= maxModelAttempts && r.Marked&(1<<r.Att) != 0:
		// A repeat: this attempt's report is in the history, also after a
		// reconciler's finding returned the record to PENDING.
		return result{next: r, snap: true}
	case r.terminal():
		return result{next: r, snap: true}
	case r.St == stUnknown && r.Ctk == in.Token:
		return result{next: r, snap: true}
	case r.St == stUnknown:
		n := r
		n.Rsn = "MARKED_UNKNOWN" // recorded, the state kept
		n.mark(&n.Marked)
		return result{next: n, snap: true}
	case r.Ctk == in.Token:
		return result{next: r, err: "COMPLETION_CONFLICT"}
	}
	n := toUnknown(r, "MARKED_UNKNOWN")
	n.mark(&n.Marked)
	return result{next: n, snap: true}
}

func renew(r record) result {
	switch {
	case r.St != stRunning:
		return result{next: r, err: "STALE_FENCING_TOKEN"}
	case r.Ended && r.Eff == effIrreversible:
		return result{next: toUnknown(r, "LEASE_EXPIRED"), err: "STALE_FENCING_TOKEN"}
	case r.Ended:
		return result{next: r, err: "STALE_FENCING_TOKEN"}
	}
	return result{next: r, snap: true}
}

// sameData reports whether two results' data are the same for Reconcile:
// an empty object is the same as none.
func sameData(a, b string) bool {
	if a == "{}" {
		a = ""
	}
	if b == "{}" {
		b = ""
	}
	return a == b
}

func reconcile(r record, in input) result {
	ok := func(n record) result { return result{next: n, snap: true} }
	switch {
	case r.St == stSucceeded || r.St == stFailed:
		// The same finding: the same kind with the outcome that stands.
		if in.Finding == findApplied && r.St == stSucceeded && in.RID == r.RID && sameData(in.Data, r.Data) ||
			in.Finding == findAbandon && r.St == stFailed && abandonCode(in) == r.Code && in.Msg == r.Msg {
			return ok(r)
		}
		return result{next: r, err: "ALREADY_RESOLVED"}
	case r.St == stRunning && !r.Ended:
		return result{next: r, err: "OPERATION_IN_PROGRESS"}
	}
	n := r
	switch in.Finding {
	case findApplied:
		n.St, n.Rsn, n.RID, n.Data, n.Code, n.Msg = stSucceeded, "RECONCILED_APPLIED", in.RID, in.Data, "", ""
	case findAbandon:
		n.St, n.Rsn, n.RID, n.Data, n.Code, n.Msg = stFailed, "ABANDONED", "", "", abandonCode(in), in.Msg
	case findNotApplied:
		// From PENDING too: the finding is recorded, so its repeat after
		// the next claim is recognised.
		n.St, n.Rsn, n.Rev = stPending, "RECONCILED_NOT_APPLIED", false
		n.addFinding(in)
	case findEscalate:
		if r.St == stUnknown && r.Rev {
			return ok(r)
		}
		n.St, n.Rsn, n.Rev = stUnknown, "ESCALATED", true
		n.addFinding(in)
	}
	n.Hld, n.Ended = "", false
	return ok(n)
}

// abandonCode is the failure code an ABANDON finding records.
func abandonCode(in input) string {
	if in.Code == "" {
		return "ABANDONED"
	}
	return in.Code
}

// matches reports whether the answer out agrees with result res, and
// returns the record with the token pinned by the answer.
func matches(res result, out output) (record, bool) {
	n := res.next
	if out.Err != res.err {
		return n, false
	}
	if res.err != "" {
		return n, true
	}
	if out.Decision != res.dec || !out.HasOp {
		return n, false
	}
	if out.State != n.St || out.Attempt != n.Att {
		return n, false
	}
	if n.St == stSucceeded && out.RID != n.RID {
		return n, false
	}
	switch {
	case n.Tok == 0 && out.Token > n.TokLo:
		n.Tok = out.Token
	case n.Tok != out.Token:
		return n, false
	}
	return n, true
}

// step is the nondeterministic model's step.
func step(state, in, out any) []any {
	r, i, o := state.(record), in.(input), out.(output)
	var next []any
	for _, s := range spontaneous(r) {
		if o.Unknown {
			// It may not have reached the store, or may have run there.
			next = append(next, s)
			for _, res := range apply(s, i) {
				next = append(next, res.next)
			}
			continue
		}
		for _, res := range apply(s, i) {
			if n, ok := matches(res, o); ok {
				next = append(next, n)
			}
		}
	}
	return next
}

// model is the porcupine model of the ledger, partitioned by operation id.
func model() porcupine.Model {
	nd := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var ids []string
			for _, op := range h {
				id := op.Input.(input).ID
				if _, ok := by[id]; !ok {
					ids = append(ids, id)
				}
				by[id] = append(by[id], op)
			}
			sort.Strings(ids)
			out := make([][]porcupine.Operation, 0, len(ids))
			for _, id := range ids {
				out = append(out, by[id])
			}
			return out
		},
		Init: func() []any { return []any{record{}} },
		Step: step,
		Equal: func(a, b any) bool {
			return a.(record) == b.(record)
		},
		DescribeOperation: describe,
		DescribeState:     func(s any) string { return s.(record).String() },
	}
	return nd.ToModel()
}

func describe(in, out any) string {
	i, o := in.(input), out.(output)
	var b strings.Builder
	b.WriteString(kindNames[i.Kind])
	switch i.Kind {
	case kReserve:
		fmt.Fprintf(&b, "(h=%s)", short(i.Holder))
	case kComplete:
		fmt.Fprintf(&b, "(t%d, outcome %d, rid=%s)", i.Token, i.Outcome, i.RID)
	case kMarkUnknown, kRenew:
		fmt.Fprintf(&b, "(t%d)", i.Token)
	case kReconcile:
		fmt.Fprintf(&b, "(t%d, finding %d, rid=%s, data=%s, failure=%s %q, by %s, note %q)", i.Token, i.Finding, i.RID, i.Data, i.Code, i.Msg, i.Principal, i.Note)
	}
	b.WriteString(" -> ")
	switch {
	case o.Unknown:
		b.WriteString("?")
	case o.Err != "":
		b.WriteString(o.Err)
	default:
		if i.Kind == kReserve {
			b.WriteString(decisionNames[o.Decision] + " ")
		}
		fmt.Fprintf(&b, "%s a%d t%d", stateNames[o.State], o.Attempt, o.Token)
		if o.RID != "" {
			b.WriteString(" rid=" + o.RID)
		}
	}
	return b.String()
}
