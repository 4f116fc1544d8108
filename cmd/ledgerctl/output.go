package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	"github.com/opledger/ledger/client"
)

// The JSON output: stable snake_case names, documented in docs/ledgerctl.md.
// Enums are their wire names (STATE_UNKNOWN), times RFC 3339 in UTC or
// null, the fingerprint hex.

type jsonOperation struct {
	OperationID      string        `json:"operation_id"`
	Tool             string        `json:"tool"`
	Effect           string        `json:"effect"`
	State            string        `json:"state"`
	Reason           string        `json:"reason"`
	Attempt          uint32        `json:"attempt"`
	MaxAttempts      uint32        `json:"max_attempts"`
	FencingToken     uint64        `json:"fencing_token"`
	ParamsSHA256     string        `json:"params_sha256"`
	PermitID         string        `json:"permit_id"`
	RunID            string        `json:"run_id"`
	Step             uint32        `json:"step"`
	Result           *jsonResult   `json:"result"`
	Failure          *jsonFailure  `json:"failure"`
	NeedsReview      bool          `json:"needs_review"`
	Compensates      string        `json:"compensates"`
	CompensatedBy    []string      `json:"compensated_by"`
	Overdue          bool          `json:"overdue"`
	CreatedAt        *string       `json:"created_at"`
	UpdatedAt        *string       `json:"updated_at"`
	LeaseExpiresAt   *string       `json:"lease_expires_at"`
	UnknownSince     *string       `json:"unknown_since"`
	RecoveryDeadline *string       `json:"recovery_deadline"`
	RetainUntil      *string       `json:"retain_until"`
	ExpiresAt        *string       `json:"expires_at"`
	History          []jsonHistory `json:"history,omitempty"`
	// HistoryTruncated is set with the history (lookup, reconcile): true
	// when its first entry is not the creation.
	HistoryTruncated *bool `json:"history_truncated,omitempty"`
	// HistoryNotKept is how many transitions before the first entry were
	// dropped, at least (0 with a whole history).
	HistoryNotKept *int `json:"history_not_kept_at_least,omitempty"`
	// HistoryBase and HistoryHead are the history chain's values before
	// the first entry and after the last, set with the history.
	HistoryBase string `json:"history_base,omitempty"`
	HistoryHead string `json:"history_head,omitempty"`
}

type jsonResult struct {
	ResourceID string         `json:"resource_id"`
	Data       map[string]any `json:"data"`
}

type jsonFailure struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Detail  string `json:"detail"`
}

type jsonHistory struct {
	Time         *string `json:"time"`
	FromState    string  `json:"from_state"`
	ToState      string  `json:"to_state"`
	Attempt      uint32  `json:"attempt"`
	FencingToken uint64  `json:"fencing_token"`
	Principal    string  `json:"principal"`
	Reason       string  `json:"reason"`
	Detail       string  `json:"detail"`
}

type jsonList struct {
	Operations []jsonOperation `json:"operations"`
	Count      int             `json:"count"`
	Truncated  bool            `json:"truncated"`
	Notices    []jsonNotice    `json:"notices"`
}

// jsonNotice is something ledgerctl says besides the record or the list
// (text on stderr without --json): a stable code and the text.
type jsonNotice struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Notice codes: stable, documented in docs/ledgerctl.md. A code starting
// with NOTHING_RECORDED means the reconcile changed nothing.
const (
	noticeRepeat       = "NOTHING_RECORDED_REPEAT"
	noticeOtherAttempt = "NOTHING_RECORDED_OTHER_ATTEMPT"
	noticeOtherResult  = "NOTHING_RECORDED_OTHER_RESULT"
	noticeOtherFailure = "NOTHING_RECORDED_OTHER_FAILURE"
	noticeNoHistory    = "HISTORY_UNREADABLE"
	noticeMoreRemain   = "MORE_REMAIN"
	noticeClockBehind  = "CLOCK_BEHIND"
)

// notices collects what a command says besides its output: printed on
// stderr at once as "ledgerctl: text", or kept for the JSON document on
// stdout with --json.
type notices []jsonNotice

func (n *notices) add(o *options, stderr io.Writer, code, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if o.json {
		*n = append(*n, jsonNotice{Code: code, Message: msg})
		return
	}
	fmt.Fprintln(stderr, "ledgerctl: "+msg)
}

// jsonDocument is what lookup and reconcile print with --json: the
// operation, whether reconcile recorded its finding, and the notices.
type jsonDocument struct {
	jsonOperation
	Recorded *bool        `json:"recorded,omitempty"`
	Notices  []jsonNotice `json:"notices"`
}

// jsonError is an error with --json, on stderr.
type jsonError struct {
	Error        string            `json:"error"`
	Reason       string            `json:"reason"`
	Code         string            `json:"code"`
	Hint         string            `json:"hint,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Violations   []jsonViolation   `json:"violations,omitempty"`
	RetryAfterMS int64             `json:"retry_after_ms,omitempty"`
}

type jsonViolation struct {
	Field       string `json:"field"`
	Description string `json:"description"`
}

// jsonTime is t as RFC 3339 in UTC with milliseconds (the ledger's
// precision, as protojson prints it), or nil.
func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := stamp(t)
	return &s
}

func toJSON(op *client.Operation, ref timeRef) jsonOperation {
	j := jsonOperation{
		OperationID: op.ID, Tool: op.Tool, Effect: op.Effect.String(), State: op.State.String(), Reason: op.Reason,
		Attempt: op.Attempt, MaxAttempts: op.MaxAttempts, FencingToken: op.FencingToken,
		ParamsSHA256: hex.EncodeToString(op.ParamsSHA256), PermitID: op.PermitID, RunID: op.RunID, Step: op.Step,
		NeedsReview: op.NeedsReview, Overdue: overdue(op, ref.now),
		Compensates: op.Compensates, CompensatedBy: append([]string{}, op.CompensatedBy...),
		CreatedAt: jsonTime(op.CreatedAt), UpdatedAt: jsonTime(op.UpdatedAt), LeaseExpiresAt: jsonTime(op.LeaseExpiresAt),
		UnknownSince: jsonTime(op.UnknownSince), RecoveryDeadline: jsonTime(op.RecoveryDeadline),
		RetainUntil: jsonTime(op.RetainUntil), ExpiresAt: jsonTime(op.ExpiresAt),
	}
	if op.Result != nil {
		j.Result = &jsonResult{ResourceID: op.Result.ResourceID, Data: op.Result.Data}
	}
	if op.Failure != nil {
		j.Failure = &jsonFailure{Code: op.Failure.Code, Message: op.Failure.Message, Detail: op.Failure.Detail}
	}
	if len(op.History) > 0 {
		n, cut := notKept(op.History)
		j.HistoryTruncated, j.HistoryNotKept = &cut, &n
		j.HistoryBase, j.HistoryHead = op.HistoryBase, op.HistoryHead
	}
	for _, h := range op.History {
		j.History = append(j.History, jsonHistory{
			Time: jsonTime(h.Time), FromState: h.From.String(), ToState: h.To.String(), Attempt: h.Attempt,
			FencingToken: h.FencingToken, Principal: h.Principal, Reason: h.Reason, Detail: h.Detail,
		})
	}
	return j
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// printOperation prints a record: JSON (with recorded, when not nil, and
// the notices), or a readable block and its history.
func printOperation(w io.Writer, o *options, op *client.Operation, ref timeRef, recorded *bool, notes notices) error {
	if o.json {
		return writeJSON(w, jsonDocument{jsonOperation: toJSON(op, ref), Recorded: recorded, Notices: append([]jsonNotice{}, notes...)})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("operation", clean(op.ID))
	row("tool", clean(op.Tool))
	row("state", stateName(op.State))
	row("reason", orDash(clean(op.Reason)))
	row("effect", strings.TrimPrefix(op.Effect.String(), "EFFECT_"))
	row("attempt", fmt.Sprintf("%d of %d", op.Attempt, op.MaxAttempts))
	row("fencing token", strconv.FormatUint(op.FencingToken, 10))
	row("permit", orDash(clean(op.PermitID)))
	run := orDash(clean(op.RunID))
	if op.Step != 0 {
		run += fmt.Sprintf(" (step %d)", op.Step)
	}
	row("run", run)
	row("params sha256", orDash(hex.EncodeToString(op.ParamsSHA256)))
	row("result", resultText(op.Result))
	row("failure", failureText(op.Failure))
	row("needs review", yesNo(op.NeedsReview))
	row("compensates", orDash(clean(op.Compensates)))
	by := make([]string, len(op.CompensatedBy))
	for i, id := range op.CompensatedBy {
		by[i] = clean(id)
	}
	row("compensated by", orDash(strings.Join(by, ", ")))
	row("created", ref.when(op.CreatedAt))
	row("updated", ref.when(op.UpdatedAt))
	lease := ref.when(op.LeaseExpiresAt)
	if !op.LeaseExpiresAt.IsZero() && !ref.now.Before(op.LeaseExpiresAt) {
		lease = stamp(op.LeaseExpiresAt) + " (ended " + ref.since(op.LeaseExpiresAt) + " ago)"
	}
	row("lease expires", lease)
	row("unknown since", ref.when(op.UnknownSince))
	deadline := ref.when(op.RecoveryDeadline)
	if overdue(op, ref.now) {
		deadline = stamp(op.RecoveryDeadline) + " (OVERDUE by " + ref.since(op.RecoveryDeadline) + ")"
	}
	row("recovery deadline", deadline)
	row("retain until", ref.when(op.RetainUntil))
	row("expires", ref.when(op.ExpiresAt))
	if op.HistoryHead != "" {
		row("history head", clean(op.HistoryHead))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(op.History) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nhistory (oldest first):\n")
	if n, cut := notKept(op.History); cut {
		fmt.Fprintf(w, "… at least %d earlier transition%s not kept (the ledger keeps the latest %d)\n", n, plural(n), historyLimit)
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tFROM → TO\tATTEMPT\tPRINCIPAL\tREASON\tDETAIL")
	for _, h := range op.History {
		from := "-"
		if h.From != 0 {
			from = stateName(h.From)
		}
		fmt.Fprintf(tw, "%s\t%s → %s\t%d\t%s\t%s\t%s\n", stamp(h.Time), from, stateName(h.To), h.Attempt,
			orDash(clean(h.Principal)), orDash(clean(h.Reason)), orDash(clean(h.Detail)))
	}
	return tw.Flush()
}

// printList prints the unresolved operations: JSON (with the notices), or
// a table.
func printList(w io.Writer, o *options, ops []*client.Operation, truncated bool, ref timeRef, notes notices) error {
	if o.json {
		l := jsonList{Operations: []jsonOperation{}, Count: len(ops), Truncated: truncated, Notices: append([]jsonNotice{}, notes...)}
		for _, op := range ops {
			l.Operations = append(l.Operations, toJSON(op, ref))
		}
		return writeJSON(w, l)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tTOOL\tSTATE\tATTEMPT\tAGE\tUNKNOWN SINCE\tRECOVERY DEADLINE\tNEEDS REVIEW")
	for _, op := range ops {
		age := "-"
		if !op.CreatedAt.IsZero() {
			age = ref.since(op.CreatedAt)
		}
		since, deadline := "-", "-"
		if !op.UnknownSince.IsZero() {
			since = shortStamp(op.UnknownSince)
		}
		if !op.RecoveryDeadline.IsZero() {
			deadline = shortStamp(op.RecoveryDeadline)
			if overdue(op, ref.now) {
				deadline += " OVERDUE"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", clean(op.ID), clean(op.Tool), stateName(op.State),
			op.Attempt, op.MaxAttempts, age, since, deadline, yesNo(op.NeedsReview))
	}
	return tw.Flush()
}

// historyLimit is how many transitions the ledger keeps per operation, the
// latest ones: ledger.HistoryLimit (a test checks they agree; the ledger
// package is not linked into ledgerctl).
const historyLimit = 50

// notKept reports whether the history h (oldest first, not empty) was cut:
// its first entry is not the creation. Then n is how many transitions were
// dropped before it, at least: every claim of an attempt before the first
// entry's (the creation is attempt 1's), and that attempt's own claim
// unless it is the first entry (a transition into RUNNING is a claim).
func notKept(h []client.HistoryEntry) (n int, cut bool) {
	first := h[0]
	if first.From == 0 { // STATE_UNSPECIFIED: the creation
		return 0, false
	}
	n = int(first.Attempt)
	if first.To == client.StateRunning {
		n--
	}
	return max(n, 1), true
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func resultText(r *client.Result) string {
	if r == nil {
		return "-"
	}
	var parts []string
	if r.ResourceID != "" {
		parts = append(parts, "resource_id "+clean(r.ResourceID))
	}
	if r.Data != nil {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(r.Data); err == nil {
			parts = append(parts, "data "+clean(strings.TrimSpace(b.String())))
		}
	}
	if len(parts) == 0 {
		return "(empty)"
	}
	return strings.Join(parts, ", ")
}

func failureText(f *client.Failure) string {
	if f == nil {
		return "-"
	}
	s := orDash(clean(f.Code))
	if f.Message != "" {
		s += ": " + clean(f.Message)
	}
	if f.Detail != "" {
		s += " (detail: " + clean(f.Detail) + ")"
	}
	return s
}

// stateName is a state without its STATE_ prefix.
func stateName(s client.State) string { return strings.TrimPrefix(s.String(), "STATE_") }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// clean makes text from the ledger safe for a terminal: a string with
// control or otherwise invisible characters (a note may hold any UTF-8) is
// shown quoted, with those characters escaped. So is one that would print
// like another or like more than one cell: with a leading or trailing space
// ("wf-1 " and "wf-1" are two operations), with a run of spaces (the
// tables' column gap), starting with a double quote (as quoted text does),
// or "-" (what the views print for none).
func clean(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 &&
		!strings.HasPrefix(s, " ") && !strings.HasSuffix(s, " ") && !strings.Contains(s, "  ") &&
		!strings.HasPrefix(s, `"`) && s != "-" {
		return s
	}
	return strconv.QuoteToGraphic(s)
}

// stamp is a time in UTC with milliseconds, as the ledger records them.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

// shortStamp is a time in UTC to the second, for tables.
func shortStamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05Z07:00") }

// skewTolerance is how far the store's clock may be seen ahead of this
// machine's before relative times are marked as bounds.
const skewTolerance = time.Second

// timeRef is the "now" that relative times (ages, "ago", "in") are
// reckoned from: this machine's clock, unless the answer holds a time the
// store recorded after it (the store's clock is ahead). The store's clock
// has passed every time it recorded, so then the latest of those is a
// better "now": never after the store's, so the time since a recorded time
// is never negative, and at least the one shown.
type timeRef struct {
	now time.Time
	// behind is how far this machine's clock is behind the store's, at
	// least, when that is skewTolerance or more (0 otherwise); relative
	// times are then printed as bounds: ≥ since, ≤ until.
	behind time.Duration
}

// reference is the timeRef for an answer holding ops, read when this
// machine's clock said local.
func reference(local time.Time, ops ...*client.Operation) timeRef {
	return referenceAt(local, latestRecorded(local, ops...))
}

// latestRecorded is the latest of t and the times the store recorded in
// ops (creation, update, UNKNOWN since, history).
func latestRecorded(t time.Time, ops ...*client.Operation) time.Time {
	for _, op := range ops {
		for _, r := range []time.Time{op.CreatedAt, op.UpdatedAt, op.UnknownSince} {
			if r.After(t) {
				t = r
			}
		}
		for _, h := range op.History {
			if h.Time.After(t) {
				t = h.Time
			}
		}
	}
	return t
}

// referenceAt is the timeRef when this machine's clock said local and the
// latest time the store recorded in the answer is latest.
func referenceAt(local, latest time.Time) timeRef {
	if latest.Before(local) {
		latest = local
	}
	r := timeRef{now: latest}
	if d := latest.Sub(local); d >= skewTolerance {
		r.behind = d
	}
	return r
}

// notice is the notice that this machine's clock is behind, or "".
func (r timeRef) notice() string {
	if r.behind == 0 {
		return ""
	}
	return "this machine's clock is behind the store's by at least " + span(r.behind) + ": times relative to now are reckoned from " +
		stamp(r.now) + ", the latest time the store recorded in this answer, and shown as bounds (≥ at least, ≤ at most);" +
		" keep clocks in sync (NTP)"
}

// since is how long before the reference time t is (0 at most), marked as
// a lower bound when the clock is behind.
func (r timeRef) since(t time.Time) string {
	s := span(max(r.now.Sub(t), 0))
	if r.behind > 0 {
		s = "≥" + s
	}
	return s
}

// when is a time with how long ago (or ahead) it is, or "-".
func (r timeRef) when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	if !t.After(r.now) {
		return stamp(t) + " (" + r.since(t) + " ago)"
	}
	in := span(t.Sub(r.now))
	if r.behind > 0 {
		in = "≤" + in
	}
	return stamp(t) + " (in " + in + ")"
}

// span is a short duration: 450ms, 42s, 3m07s, 5h03m, 3d04h.
func span(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// localError is a failure before or around a call (a TLS file, the
// address), with a reason of its own and a hint (what to do) when it has
// one.
type localError struct{ reason, msg, hint string }

func (e *localError) Error() string { return e.msg }

// codeNames are the canonical names of the gRPC codes.
var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN", codes.InvalidArgument: "INVALID_ARGUMENT",
	codes.DeadlineExceeded: "DEADLINE_EXCEEDED", codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED", codes.OutOfRange: "OUT_OF_RANGE",
	codes.Unimplemented: "UNIMPLEMENTED", codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE",
	codes.DataLoss: "DATA_LOSS", codes.Unauthenticated: "UNAUTHENTICATED",
}

func codeName(c codes.Code) string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return "CODE_" + strconv.Itoa(int(c))
}

// scopeHints say which scopes each command needs (server/auth.go,
// methodScopes).
var scopeHints = map[string]string{
	"lookup":          "lookup needs an API key with the agent, reconciler or viewer scope",
	"list-unresolved": "list-unresolved needs an API key with the reconciler or viewer scope",
	"reconcile":       "reconcile needs an API key with the reconciler scope",
	"get-run":         "get-run needs an API key with the agent, reconciler or viewer scope",
	"list-runs":       "list-runs needs an API key with the reconciler or viewer scope",
	"end-run":         "end-run needs an API key with the agent or reconciler scope",
}

// describe turns an error into its reason, code, message and a hint. It
// never includes the API key.
func describe(o *options, err error) jsonError {
	d, le, ce := classify(err)
	id := ""
	if len(o.args) > 0 {
		id = " " + clean(o.args[0])
	}
	switch {
	case le != nil:
		d.Hint = le.hint
	case ce != nil && ce.Reason == "" && strings.Contains(ce.Message, "refusing to send the API key"):
		// The SDK's own refusal (client.apiKey): grpc reports it as
		// UNAUTHENTICATED, but the ledger never saw the call.
		d.Reason = "API_KEY_NOT_SENT"
		d.Hint = "the API key is only sent over TLS beyond this machine: add --tls (and --tls-ca)"
	case errors.Is(err, client.ErrUnauthenticated):
		if o.apiKey == "" && o.tlsCert == "" {
			d.Hint = "send an API key with --api-key or LEDGER_API_KEY (or a client certificate with --tls-cert and --tls-key)"
		} else {
			d.Hint = "the ledger refused the credentials: check that the API key (or client certificate) is current and not revoked"
		}
	case errors.Is(err, client.ErrPermissionDenied):
		d.Hint = scopeHints[o.cmd]
	case d.Reason == "DEADLINE_EXCEEDED":
		d.Hint = "no answer within --timeout " + o.timeout.String() + ": is the ledger at " + o.addr + " up? (a slow link needs a longer --timeout)"
	case d.Reason == "UNAVAILABLE":
		switch {
		case strings.Contains(d.Error, "first record does not look like a TLS handshake"):
			d.Hint = "the server at " + o.addr + " does not serve TLS: leave out --tls and the TLS files, or check --addr"
		case strings.Contains(d.Error, "looked like an HTTP/1.1 header"):
			d.Hint = "the server at " + o.addr + " answers HTTP/1.1, not gRPC: ledgerd's HTTP/JSON API (--http-listen)? " +
				"ledgerctl needs the port of --listen"
		case strings.Contains(d.Error, "certificate") || strings.Contains(d.Error, "tls:") || strings.Contains(d.Error, "x509"):
			d.Hint = "the TLS handshake failed: check --tls-ca (the CA of the ledger's certificate) and that --addr names a host the certificate is for"
		default:
			d.Hint = "cannot reach the ledger at " + o.addr + ": check --addr (LEDGER_ADDR), that ledgerd runs there, and whether it serves TLS (--tls)"
		}
	case d.Reason == "NOT_FOUND" && (o.cmd == "get-run" || o.cmd == "end-run"):
		d.Hint = "ledgerctl sees only the tenant of its credentials: check the run id (exactly, spaces included) and that the key is of the run's tenant"
	case d.Reason == "RUN_ENDED":
		d.Hint = "see ledgerctl get-run" + id
	case d.Reason == "NOT_FOUND":
		d.Hint = "ledgerctl sees only the tenant of its credentials: check the operation id (exactly, spaces included) and that the key is of the operation's tenant"
	case d.Reason == "IDEMPOTENCY_KEY_EXPIRED":
		d.Hint = "only its tombstone is left: it ended " + strings.TrimPrefix(d.Metadata["final_state"], "STATE_")
		if h := d.Metadata["history_head"]; h != "" {
			d.Hint += "; its history chain's head is " + clean(h) + ", which a receipt of that final state names"
		}
	case d.Reason == "STORE_UNAVAILABLE":
		d.Hint = "the ledger cannot reach its store; retry the same command later"
	case d.Reason == "OPERATION_IN_PROGRESS":
		d.Hint = "its worker may still report; if it does not, reconcile once the lease has ended"
		if ce != nil && ce.RetryAfter > 0 {
			d.Hint += " (in " + span(ce.RetryAfter) + ")"
		}
	case d.Reason == "ALREADY_RESOLVED":
		d.Hint = alreadyResolvedHint(o, d, ce, id)
	case d.Reason == "STALE_FENCING_TOKEN" && o.cmd == "reconcile" && o.fencingToken == 0:
		// Unfenced: the ledger holds this finding and note about an
		// earlier attempt, and cannot tell a retry from a new finding.
		d.Hint = "this key recorded this finding with this note about an earlier attempt, and another attempt holds the operation now:" +
			" nothing was recorded; to record it about the current attempt, ask the destination again and give its --fencing-token" +
			" (ledgerctl lookup" + id + ") or a new --note"
	case d.Reason == "STALE_FENCING_TOKEN" && o.cmd == "reconcile":
		d.Hint = "another attempt holds the operation now: nothing was recorded; see ledgerctl lookup" + id + " and ask the destination again"
	case d.Reason == "RATE_LIMITED" && ce != nil && ce.RetryAfter > 0:
		d.Hint = "retry after " + span(ce.RetryAfter)
	}
	if o.cmd == "reconcile" && le == nil && slices.Contains([]string{"DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED", "STORE_UNAVAILABLE", "NOT_REPLICATED"}, d.Reason) {
		// No answer: the call may have reached the ledger all the same.
		// NOT_REPLICATED: it ran on the primary, which may hold the finding.
		if d.Hint != "" {
			d.Hint += "; "
		}
		d.Hint += "the finding may have been recorded: see ledgerctl lookup" + id + ", or run the same command again (same finding, --note and" +
			" --fencing-token), which records it once; another finding or note could record a second one"
	}
	return d
}

// classify turns err into its reason, code and message, and returns the
// local or ledger error it is, if any.
func classify(err error) (d jsonError, le *localError, ce *client.Error) {
	switch {
	case errors.As(err, &le):
		d = jsonError{Error: le.msg, Reason: le.reason}
	case errors.As(err, &ce):
		d = jsonError{Error: ce.Message, Reason: ce.Reason, Code: codeName(ce.Code), Metadata: ce.Metadata,
			RetryAfterMS: ce.RetryAfter.Milliseconds()}
		if d.Reason == "" {
			d.Reason = d.Code
		}
		for _, v := range ce.Violations {
			d.Violations = append(d.Violations, jsonViolation{Field: v.Field, Description: v.Description})
		}
	case errors.Is(err, context.DeadlineExceeded):
		d = jsonError{Error: err.Error(), Reason: "DEADLINE_EXCEEDED", Code: "DEADLINE_EXCEEDED"}
	case errors.Is(err, context.Canceled):
		d = jsonError{Error: "interrupted", Reason: "CANCELLED", Code: "CANCELLED"}
	default:
		d = jsonError{Error: err.Error(), Reason: "ERROR"}
	}
	d.Error = strings.ToValidUTF8(d.Error, "?")
	return d, le, ce
}

// alreadyResolvedHint is the hint for ALREADY_RESOLVED on the operation
// id (" ID"): the state that stands, and whether a finding was refused for
// another outcome than it.
func alreadyResolvedHint(o *options, d jsonError, ce *client.Error, id string) string {
	hint := "see ledgerctl lookup" + id
	st := strings.TrimPrefix(d.Metadata["state"], "STATE_")
	kind := client.FindingKind(0)
	if o.cmd == "reconcile" && len(o.args) > 1 {
		kind = findings[strings.ToLower(o.args[1])]
	}
	switch {
	case kind != 0 && ce != nil && otherOutcome(ce, kind):
		// The record's own kind of finding, with another outcome.
		what := "result"
		if kind == client.Abandon {
			what = "failure"
		}
		return "it is " + st + " with another " + what + " than this finding's, which stands: nothing was recorded; " + hint
	case st != "":
		return "it is " + st + ": " + hint
	}
	return hint
}

// line is the error as one line for humans.
func (d jsonError) line() string {
	s := d.Reason + ": " + clean(d.Error)
	if d.Hint != "" {
		s += "; " + d.Hint
	}
	return s
}

// report prints an error: one line, or one JSON object with --json.
func report(w io.Writer, o *options, err error) {
	d := describe(o, err)
	if o.json {
		b, _ := json.Marshal(d)
		fmt.Fprintf(w, "%s\n", b)
		return
	}
	fmt.Fprintln(w, "ledgerctl: "+d.line())
}
