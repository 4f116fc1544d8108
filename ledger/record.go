package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/opledger/ledger/chain"
	"github.com/opledger/ledger/fingerprint"
)

// The stored form of a record (scripts/common.lua writes it, newRecord.tail
// encodes most of a new one, docs/design.md §2 describes it): one string
// per operation,
//
//	'L' <fingerprint: 32 bytes> <field> 0xFF <field> ... [0xFE <history entry>]...
//
// with the fields in the order below (trailing empty ones left out) and
// each history entry <from><to><reason letter><t> 0xFD <attempt> 0xFD
// <token> [0xFD <principal> [0xFD <detail>]]. Every text value is UTF-8 the
// ledger validated, so the separator bytes 0xFC-0xFF, which UTF-8 never
// uses, cannot occur in one.
const (
	recordVersion = 'L'
	fieldSep      = 0xFF
	historySep    = 0xFE
	entrySep      = 0xFD
	samePrincipal = "\xFC" // the principal of the previous entry
	// compensationSep joins the ids of a record's compensations.
	compensationSep = "\xFC"
)

// The fields of the stored form, in order.
const (
	fSt = iota
	fExp
	fCt
	fUt
	fAtt
	fTok
	fEff
	fRsn
	fTool
	fPmt
	fMax
	fRet
	fTret
	fCdg
	fRd
	fRid
	fFc
	fFm
	fHld
	fLse
	fLms
	fRwin
	fUks
	fRev
	fRun
	fStp
	fRu
	fRue
	fCfh
	fCf
	fCmp
	fCby
	fHb
	numFields
)

// reasonNames are the transition reasons by their stored letter ('A' + i).
var reasonNames = [...]string{
	"RESERVED", "CLAIMED", "RECLAIMED", "SUCCEEDED", "FAILED_FINAL",
	"FAILED_RETRYABLE", "MARKED_UNKNOWN", "LEASE_EXPIRED", "RETRIES_EXHAUSTED",
	"RECONCILED_APPLIED", "RECONCILED_NOT_APPLIED", "ABANDONED", "ESCALATED",
}

func reasonName(code string) string {
	if len(code) == 1 && code[0] >= 'A' && int(code[0]-'A') < len(reasonNames) {
		return reasonNames[code[0]-'A']
	}
	return code
}

// record is what a script answered about one operation: the snapshot of its
// record (op nil when the answer carries none) and the transition the call
// made, if any.
type record struct {
	op      *Operation
	history string // the stored history, decoded by Lookup and Reconcile only
	moved   bool
	from    State
	dwell   time.Duration
}

var errBadRecord = errors.New("malformed record")

// recordFromReply decodes a script's reply {code, aux, record, moved}.
func recordFromReply(raw []any) (*record, error) {
	// The record and its snapshot in one allocation.
	both := &struct {
		r  record
		op Operation
	}{}
	r := &both.r
	if s, _ := raw[2].(string); s != "" {
		hist, err := decodeRecordInto(&both.op, s)
		if err != nil {
			return nil, err
		}
		r.op, r.history = &both.op, hist
	}
	if len(raw) > 3 {
		if m, _ := raw[3].(string); m != "" {
			from, dwell, _ := strings.Cut(m, ":")
			r.moved, r.from = true, parseState(from)
			r.dwell = time.Duration(millis(dwell)) * time.Millisecond
		}
	}
	return r, nil
}

// toOperation returns the snapshot of a script's answer, for operation id.
func toOperation(id string, r *record) *Operation {
	r.op.ID = id
	return r.op
}

// newRecord is what a new operation records: its first claim, and the
// policy bound at creation.
type newRecord struct {
	effect                 Effect
	tool, permit, holder   string
	maxAttempts            int
	lease, retention       time.Duration
	tombstone, recovery    time.Duration
	run                    string // with guardedRun when the run guard admitted it
	step                   uint32
	retainMS, retainEndMS  int64 // retain_until, and with the grace (0: none)
	fieldsDigest, fields   string
	compensates, principal string
}

// newEntry is a new record's history entry up to its principal: from none
// to RUNNING by RESERVED at ct, attempt 1, token ct.
const newEntry = "\xfe02A\xfd1\xfd\xfd"

// tail returns the stored form of the new record after its creation time
// (reserve.lua writes what comes before): RUNNING by RESERVED, attempt 1,
// the creation time as its update time and token (so stored as empty), and
// the history entry of that transition.
func (n newRecord) tail() string {
	var arr [256]byte // most tails fit; string() below copies
	w := fieldWriter{b: arr[:0]}
	// The fields after ct, in order, up to cmp (cby and hb start empty).
	w.empty(1)
	w.str("1")
	w.empty(1)
	w.int(int64(n.effect))
	w.str("A")
	w.str(n.tool)
	w.str(n.permit)
	w.int(int64(n.maxAttempts))
	w.millis(n.retention)
	w.millis(n.tombstone)
	w.empty(5)
	w.str(n.holder)
	w.millis(n.lease)
	w.millis(n.lease)
	w.millis(n.recovery)
	w.empty(2)
	w.str(n.run)
	if n.step != 0 {
		w.int(int64(n.step))
	} else {
		w.empty(1)
	}
	if n.retainMS != 0 {
		w.int(n.retainMS)
		w.millis(time.Duration(n.retainEndMS-n.retainMS) * time.Millisecond)
	} else {
		w.empty(2)
	}
	w.str(n.fieldsDigest)
	w.str(n.fields)
	w.str(n.compensates)
	b := append(w.b[:w.end], newEntry...)
	return string(append(b, n.principal...))
}

// fieldWriter appends a record's fields, each after fieldSep. end is the
// length up to the last non-empty field: trailing empty fields are not
// stored.
type fieldWriter struct {
	b   []byte
	end int
}

func (w *fieldWriter) str(s string) {
	w.b = append(append(w.b, fieldSep), s...)
	if s != "" {
		w.end = len(w.b)
	}
}

// empty appends n empty fields.
func (w *fieldWriter) empty(n int) {
	for range n {
		w.b = append(w.b, fieldSep)
	}
}

func (w *fieldWriter) int(i int64) {
	w.b = strconv.AppendInt(append(w.b, fieldSep), i, 10)
	w.end = len(w.b)
}

func (w *fieldWriter) millis(d time.Duration) {
	w.b = appendMillis(append(w.b, fieldSep), d)
	w.end = len(w.b)
}

// decodeRecord decodes a record's stored form into a snapshot without
// history, and returns its stored history for parseHistory.
func decodeRecord(s string) (*Operation, string, error) {
	o := &Operation{}
	hist, err := decodeRecordInto(o, s)
	if err != nil {
		return nil, "", err
	}
	return o, hist, nil
}

// decodeRecordInto is decodeRecord into the zero snapshot o.
func decodeRecordInto(o *Operation, s string) (string, error) {
	if len(s) < 1+len(fingerprint.Fingerprint{}) || s[0] != recordVersion {
		return "", errBadRecord
	}
	copy(o.Fingerprint[:], s[1:33])
	body, hist := s[33:], ""
	if i := strings.IndexByte(body, historySep); i >= 0 {
		body, hist = body[:i], body[i:]
	}
	var f [numFields]string
	for i := 0; i < numFields && body != ""; i++ {
		j := strings.IndexByte(body, fieldSep)
		if j < 0 {
			f[i], body = body, ""
			break
		}
		f[i], body = body[:j], body[j+1:]
	}
	ct, err := strconv.ParseInt(f[fCt], 36, 64)
	if err != nil || f[fSt] == "" {
		return "", errBadRecord
	}
	ut := ct + millis(f[fUt])
	o.State = parseState(f[fSt])
	o.Tool = f[fTool]
	o.Effect = Effect(parseUint(f[fEff]))
	o.Attempt = uint32(parseUint(f[fAtt]))
	o.FencingToken = uint64(ct + millis(f[fTok]))
	o.PermitID = f[fPmt]
	o.RunID, o.runGuarded = strings.CutPrefix(f[fRun], guardedRun)
	o.Step = uint32(parseUint(f[fStp]))
	o.Holder = f[fHld]
	o.Reason = reasonName(f[fRsn])
	o.NeedsReview = f[fRev] == "1"
	o.Compensates = f[fCmp]
	if f[fCby] != "" {
		o.CompensatedBy = strings.Split(f[fCby], compensationSep)
	}
	o.CreatedAt = msTime(ct)
	o.UpdatedAt = msTime(ut)
	o.MaxAttempts = uint32(parseUint(f[fMax]))
	if f[fLse] != "" {
		o.LeaseExpiresAt = msTime(ut + millis(f[fLse]))
	}
	if f[fUks] != "" {
		o.UnknownSince = msTime(ut + millis(f[fUks]))
		o.RecoveryDeadline = o.UnknownSince.Add(time.Duration(millis(f[fRwin])) * time.Millisecond)
	}
	if f[fRu] != "" {
		o.RetainUntil = msTime(millis(f[fRu]))
	}
	if f[fExp] != "" {
		o.ExpiresAt = msTime(ut + millis(f[fExp]))
	} else if o.State.Terminal() {
		// Left empty: the retention after the last change.
		o.ExpiresAt = msTime(ut + millis(f[fRet]))
	}
	if o.State == StateSucceeded {
		o.Result = &Result{ResourceID: f[fRid]}
		if d := f[fRd]; d != "" {
			o.Result.Data = []byte(d)
		}
	}
	detail := ""
	if o.State == StateFailedFinal {
		detail = f[fRd] // a final failure's detail is kept where a result's data is
	}
	if f[fFc] != "" || f[fFm] != "" || detail != "" {
		o.Failure = &Failure{Code: f[fFc], Message: f[fFm], Detail: detail}
	}
	o.hist, o.histBase = hist, f[fHb]
	if o.histBase == "" {
		o.histBase = chain.Genesis
	}
	return hist, nil
}

// parseHistory decodes a record's stored history, oldest first. It needs
// the record's creation time: entry times and tokens are stored after it.
func parseHistory(h string, created time.Time) []HistoryEntry {
	if h == "" {
		return nil
	}
	ct := int64(0)
	if !created.IsZero() {
		ct = created.UnixMilli()
	}
	out := make([]HistoryEntry, 0, strings.Count(h, "\xfe")+1)
	principal := ""
	for h != "" {
		h = h[1:] // the separator
		e := h
		if i := strings.IndexByte(h, historySep); i >= 0 {
			e, h = h[:i], h[i:]
		} else {
			h = ""
		}
		if len(e) < 3 {
			continue
		}
		var sub [5]string
		n := 0
		for rest := e[3:]; n < len(sub); n++ {
			j := strings.IndexByte(rest, entrySep)
			if j < 0 {
				sub[n] = rest
				n++
				break
			}
			sub[n], rest = rest[:j], rest[j+1:]
		}
		if n >= 4 && sub[3] != samePrincipal {
			principal = sub[3]
		}
		out = append(out, HistoryEntry{
			Time:         msTime(ct + millis(sub[0])),
			From:         parseState(e[0:1]),
			To:           parseState(e[1:2]),
			Reason:       reasonName(e[2:3]),
			Attempt:      uint32(parseUint(sub[1])),
			FencingToken: uint64(ct + millis(sub[2])),
			Principal:    principal,
			Detail:       sub[4],
		})
	}
	return out
}

// Chain returns o's history chain (docs/receipts.md, "The history chain"): the value before
// the oldest entry kept (chain.Genesis unless older ones were dropped) and
// the head, the value after the latest. Both are "" for an operation that
// came without its record's history.
func (o *Operation) Chain() (base, head string) {
	if o.histBase == "" && o.History == nil {
		return "", ""
	}
	h := o.History
	if h == nil {
		h = parseHistory(o.hist, o.CreatedAt)
	}
	base = o.histBase
	if base == "" {
		base = chain.Genesis
	}
	return base, chain.Head(base, chainEntries(h))
}

// chainEntries are the entries of h as the history chain hashes them.
func chainEntries(h []HistoryEntry) []chain.Entry {
	out := make([]chain.Entry, len(h))
	for i, e := range h {
		out[i] = chainEntry(e)
	}
	return out
}

// chainEntry is e as the history chain hashes it.
func chainEntry(e HistoryEntry) chain.Entry {
	ms := int64(0) // the zero time is Unix time 0, as stored
	if !e.Time.IsZero() {
		ms = e.Time.UnixMilli()
	}
	return chain.Entry{
		TimeMillis: ms, From: int32(e.From), To: int32(e.To), Reason: e.Reason,
		Attempt: e.Attempt, FencingToken: e.FencingToken, Principal: e.Principal, Detail: e.Detail,
	}
}

// millis decodes a stored duration or time difference: decimal ms, or whole
// seconds, minutes, hours or days with the suffix s, m, h or d; "" is 0.
func millis(s string) int64 {
	unit := int64(1)
	if s != "" {
		switch s[len(s)-1] {
		case 's':
			unit = 1000
		case 'm':
			unit = 60 * 1000
		case 'h':
			unit = 3600 * 1000
		case 'd':
			unit = 24 * 3600 * 1000
		}
		if unit != 1 {
			s = s[:len(s)-1]
		}
	}
	if s == "" {
		return 0
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return n * unit
}

// encodeMillis encodes a duration as the record stores it (millis decodes
// it): whole days, hours, minutes or seconds with their suffix when the
// duration is one, else decimal ms.
func encodeMillis(d time.Duration) string {
	return string(appendMillis(nil, d))
}

// appendMillis appends encodeMillis(d) to b.
func appendMillis(b []byte, d time.Duration) []byte {
	ms := d.Milliseconds()
	for _, u := range [...]struct {
		ms     int64
		suffix byte
	}{{24 * 3600 * 1000, 'd'}, {3600 * 1000, 'h'}, {60 * 1000, 'm'}, {1000, 's'}} {
		if ms != 0 && ms%u.ms == 0 {
			return append(strconv.AppendInt(b, ms/u.ms, 10), u.suffix)
		}
	}
	return strconv.AppendInt(b, ms, 10)
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

func parseState(s string) State {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > int(StateUnknown) {
		return StateUnspecified
	}
	return State(n)
}

func parseUint(s string) uint64 {
	if s == "" {
		return 0
	}
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// outcomeDigest identifies a Complete's outcome, so a repeat can be told
// from a different report under the same token: 16 hex digits (64 bits) of
// SHA-256 over the outcome and the length-prefixed result and failure.
func outcomeDigest(o Outcome, r Result, f Failure) string {
	h := sha256.New()
	var n [8]byte
	h.Write([]byte{byte(o)})
	for _, part := range [][]byte{r.Data, []byte(r.ResourceID), []byte(f.Code), []byte(f.Message)} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
