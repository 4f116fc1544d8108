package ledger

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/opledger/ledger/chain"
	"github.com/opledger/ledger/internal/autopipe"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestHistoryKeepsTheLatest50 drives an operation through more than 50
// transitions by two principals, with notes, and checks Lookup returns
// exactly the latest 50 entries with their own principal, reason and
// detail: the stored history drops the oldest entry and names a principal
// only when it changes, so the entry that becomes the first must get its
// principal back. The history chain survives the drops: the heads Lookup
// answered after each transition (as receipts would sign them) are the
// chain's values over the kept entries, from the base the script folded
// the dropped ones into, and the expired record and its tombstone keep
// the last one.
func TestHistoryKeepsTheLatest50(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		pol, err := ParsePolicies([]byte("defaults:\n  max_attempts: 100\n  retention: 1s\n  retain_grace: 0s\n  tombstone_retention: 1h\n"))
		if err != nil {
			t.Fatal(err)
		}
		l, err := New(e.lrdb, Options{Policies: pol})
		if err != nil {
			t.Fatal(err)
		}
		type want struct{ reason, principal, detail string }
		var model []want
		var heads []string // the head after each entry
		moved := func(w want) {
			model = append(model, w)
			o, err := l.Lookup(e.ctx, e.who, "op")
			if err != nil {
				t.Fatal(err)
			}
			_, head := o.Chain()
			heads = append(heads, head)
		}
		who := func(name string) Principal { return Principal{Tenant: e.who.Tenant, ID: name} }
		reserve := func(p Principal, reason string) uint64 {
			res, err := l.Reserve(e.ctx, p, ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h-" + p.ID})
			if err != nil || res.Decision != DecisionExecute {
				t.Fatalf("Reserve: %v %v", res, err)
			}
			moved(want{reason, p.ID, ""})
			return res.Operation.FencingToken
		}
		tok := reserve(who("agent-1"), "RESERVED")
		for i := range 30 {
			p := who("agent-1")
			if i%3 == 1 {
				p = who("agent-2")
			}
			if _, err := l.Complete(e.ctx, p, CompleteRequest{OperationID: "op", FencingToken: tok, Outcome: OutcomeFailedRetryable,
				Failure: &Failure{Code: "busy"}}); err != nil {
				t.Fatal(err)
			}
			moved(want{"FAILED_RETRYABLE", p.ID, ""})
			if i%5 == 4 {
				p = who("") // an empty principal is one too
			}
			tok = reserve(p, "CLAIMED")
		}
		// Same principal as the entry before, with a note; then another one.
		if _, err := l.MarkUnknown(e.ctx, who(model[len(model)-1].principal), MarkUnknownRequest{OperationID: "op", FencingToken: tok, Reason: "timeout ÿ"}); err != nil {
			t.Fatal(err)
		}
		moved(want{"MARKED_UNKNOWN", model[len(model)-1].principal, "timeout ÿ"})
		if _, err := l.Reconcile(e.ctx, who("reconciler"), ReconcileRequest{OperationID: "op", Finding: FindingEscalate, Note: "ask finance"}); err != nil {
			t.Fatal(err)
		}
		moved(want{"ESCALATED", "reconciler", "ask finance"})

		o, err := l.Lookup(e.ctx, e.who, "op")
		if err != nil {
			t.Fatal(err)
		}
		if len(o.History) != HistoryLimit {
			t.Fatalf("%d history entries, want %d", len(o.History), HistoryLimit)
		}
		dropped := len(model) - HistoryLimit
		model = model[dropped:]
		for i, h := range o.History {
			if w := model[i]; h.Reason != w.reason || h.Principal != w.principal || h.Detail != w.detail {
				t.Fatalf("entry %d = %s by %q (%q), want %s by %q (%q)", i, h.Reason, h.Principal, h.Detail, w.reason, w.principal, w.detail)
			}
			if i > 0 && (h.Time.Before(o.History[i-1].Time) || h.From != o.History[i-1].To) {
				t.Fatalf("entry %d does not follow entry %d: %+v after %+v", i, i-1, h, o.History[i-1])
			}
		}
		if last := o.History[len(o.History)-1]; last.To != StateUnknown || last.Attempt != 31 || o.Reason != "ESCALATED" || !o.NeedsReview {
			t.Fatalf("last entry %+v, record %+v", last, o)
		}

		base, _ := o.Chain()
		values := chain.Values(base, chainEntries(o.History))
		if base != heads[dropped-1] {
			t.Fatalf("base %s, want the head after the last dropped entry %s", base, heads[dropped-1])
		}
		for i, v := range values {
			if v != heads[dropped-1+i] {
				t.Fatalf("chain value %d = %s, want the head Lookup answered then, %s", i, v, heads[dropped-1+i])
			}
		}

		// Applied, past its retention: the expired record, then its
		// tombstone, answer the head.
		done, err := l.Reconcile(e.ctx, who("reconciler"), ReconcileRequest{OperationID: "op", Finding: FindingApplied, Result: &Result{ResourceID: "re_1"}})
		if err != nil {
			t.Fatal(err)
		}
		_, head := done.Chain()
		if head != chain.Link(values[len(values)-1], chainEntry(done.History[len(done.History)-1])) {
			t.Fatalf("head after the finding %s does not continue the chain", head)
		}
		expiredHead := func(when string) {
			t.Helper()
			_, err := l.Lookup(e.ctx, e.who, "op")
			if ee := wantKind(t, err, KindKeyExpired); ee.HistoryHead != head || ee.State != StateSucceeded {
				t.Fatalf("%s: Lookup answers %s with head %q, want %s", when, ee.State, ee.HistoryHead, head)
			}
		}
		e.waitExpired(t, "op")
		expiredHead("expired")
		if _, err := l.NewCompactor(0).Pass(e.ctx); err != nil {
			t.Fatal(err)
		}
		if s, _ := e.stored(t, l.keys.op(e.who.Tenant, "op").all[0]); !strings.HasSuffix(s, "\xff\xff\xff"+head) {
			t.Fatalf("compacted to %q, want a tombstone with the head %s", s, head)
		}
		expiredHead("compacted")
	})
}

// TestHistoryChainShowsTampering rewrites a stored history the ways an
// intruder with access to the store could, and checks the head a receipt
// signed before is no longer one of the chain's values; an entry appended
// by the ledger keeps it.
func TestHistoryChainShowsTampering(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		for _, tc := range []struct {
			name   string
			change func(s string) string
			kept   bool
		}{
			{"untouched", func(s string) string { return s }, true},
			{"a note rewritten", func(s string) string { return strings.Replace(s, "ask finance", "ask nobody", 1) }, false},
			{"an entry dropped", func(s string) string {
				first := 33 + strings.IndexByte(s[33:], historySep) // past the fingerprint
				second := first + 1 + strings.IndexByte(s[first+1:], historySep)
				return s[:second] + s[second+1+strings.IndexByte(s[second+1:], historySep):]
			}, false},
			{"a principal rewritten", func(s string) string { return strings.Replace(s, "reconciler", "reconcilor", 1) }, false},
		} {
			id := "tamper-" + strings.ReplaceAll(tc.name, " ", "-")
			o := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, o.FencingToken); err != nil {
				t.Fatal(err)
			}
			if _, err := e.l.Reconcile(e.ctx, Principal{Tenant: e.who.Tenant, ID: "reconciler"},
				ReconcileRequest{OperationID: id, Finding: FindingEscalate, Note: "ask finance"}); err != nil {
				t.Fatal(err)
			}
			_, signed := e.lookup(t, id).Chain()
			k := e.opKeys(id).all[0]
			s, err := e.rdb.Get(e.ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := e.rdb.Set(e.ctx, k, tc.change(s), 0).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingApplied}); err != nil {
				t.Fatal(err)
			}
			now := e.lookup(t, id)
			base, _ := now.Chain()
			if got := slices.Contains(chain.Values(base, chainEntries(now.History)), signed); got != tc.kept {
				t.Errorf("%s: the signed head is in the chain: %v, want %v", tc.name, got, tc.kept)
			}
		}
	})
}

// TestResultMustBeUTF8 checks result data that is not UTF-8 is refused: the
// stored record relies on it (its separators are bytes UTF-8 never uses).
func TestResultMustBeUTF8(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "payments.refund")
		_, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, &Result{Data: []byte("{\"a\":\"\xff\xfe\"}")}, nil)
		wantKind(t, err, KindInvalid)
		if got := e.lookup(t, "op"); got.State != StateRunning {
			t.Fatalf("state %v after a refused Complete", got.State)
		}
	})
}

// TestEncodeMillis checks the duration form the record stores, and that
// millis reads it back.
func TestEncodeMillis(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0", 150 * time.Millisecond: "150", 30 * time.Second: "30s", 90 * time.Second: "90s",
		15 * time.Minute: "15m", time.Hour: "1h", 7 * 24 * time.Hour: "7d", 1500 * time.Millisecond: "1500",
	} {
		if got := encodeMillis(d); got != want || millis(got) != d.Milliseconds() {
			t.Errorf("encodeMillis(%v) = %q (reads back %d ms), want %q", d, got, millis(got), want)
		}
	}
}

// TestRecordFromReplyMoved: a reply's moved field gives the state left and
// the time spent in it, in ms or as the record encodes a duration.
func TestRecordFromReplyMoved(t *testing.T) {
	for _, c := range []struct {
		moved string
		from  State
		dwell time.Duration
	}{
		{"", 0, 0},
		{"0:0", 0, 0},
		{"2:1500", StateRunning, 1500 * time.Millisecond},
		{"2:5s", StateRunning, 5 * time.Second},
		{"5:2m", StateUnknown, 2 * time.Minute},
		{"2:", StateRunning, 0},
	} {
		r, err := recordFromReply([]any{int64(codeOK), "", "", c.moved})
		if err != nil {
			t.Fatalf("%q: %v", c.moved, err)
		}
		if r.moved != (c.moved != "") || r.from != c.from || r.dwell != c.dwell {
			t.Errorf("%q: moved %v from %v after %v, want %v after %v", c.moved, r.moved, r.from, r.dwell, c.from, c.dwell)
		}
	}
}

// benchRecord is a SUCCEEDED record as the scripts store it: a refund with a
// 100-byte result and its two history entries.
func benchRecord(tb testing.TB) string {
	tb.Helper()
	rdb := redistest.Shared(tb).Client(tb)
	l, err := New(rdb, Options{})
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	who := Principal{Tenant: "bench-" + randomHex(4), ID: "anonymous"}
	res, err := l.Reserve(ctx, who, ReserveRequest{OperationID: "wf-1:refund", Tool: "payments.refund",
		Params: map[string]any{"amount": 1250.0, "currency": "eur"}, PermitID: "approval-77", Holder: "h-1"})
	if err != nil {
		tb.Fatal(err)
	}
	data := []byte(`{"id":"` + strings.Repeat("r", 91) + `"}`)
	if _, err := l.Complete(ctx, who, CompleteRequest{OperationID: "wf-1:refund", FencingToken: res.Operation.FencingToken,
		Outcome: OutcomeSucceeded, Result: &Result{Data: data}}); err != nil {
		tb.Fatal(err)
	}
	s, err := rdb.Get(ctx, l.keys.op(who.Tenant, "wf-1:refund").all[0]).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// BenchmarkDecodeRecord decodes a record as every RPC's reply does.
func BenchmarkDecodeRecord(b *testing.B) {
	s := benchRecord(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := decodeRecord(s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseHistory decodes the history, as Lookup does.
func BenchmarkParseHistory(b *testing.B) {
	s := benchRecord(b)
	o, h, err := decodeRecord(s)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(parseHistory(h, o.CreatedAt)) != 2 {
			b.Fatal("want 2 entries")
		}
	}
}

// benchLedger is a ledger on the shared redis-server with a tenant of its
// own.
func benchLedger(b *testing.B) (*Ledger, Principal) {
	b.Helper()
	l, err := New(redistest.Shared(b).Client(b), Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := l.LoadScripts(context.Background()); err != nil {
		b.Fatal(err)
	}
	return l, Principal{Tenant: "bench-" + randomHex(4), ID: "anonymous"}
}

// BenchmarkReserve is ledger.Reserve of new keys, one at a time: validation,
// fingerprint, the script's round trip on a real redis-server, the reply.
func BenchmarkReserve(b *testing.B) {
	l, who := benchLedger(b)
	ctx := context.Background()
	params := map[string]any{"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250.0, "currency": "eur", "reason": "requested_by_customer"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := l.Reserve(ctx, who, ReserveRequest{OperationID: "wf-" + strconv.Itoa(i) + ":refund", Tool: "payments.refund",
			Params: params, PermitID: "approval-77", Holder: "h-1"}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReserveParallel is ledger.Reserve of new keys from 50 goroutines
// through the auto-pipelining client ledgerd uses. It reports cpu-µs/op,
// the CPU this process spent per Reserve (Redis runs in a process of its
// own): the ledger's own cost per call with the Redis client's, as in
// ledgerd but without its gRPC surface (docs/benchmarks.md, section 6.16).
func BenchmarkReserveParallel(b *testing.B) {
	rdb := redistest.Shared(b).Client(b)
	defer autopipe.Enable(rdb, autopipe.Options{}).Close()
	l, err := New(rdb, Options{UnresolvedLimit: func(string) int { return 1_000_000_000 }})
	if err != nil {
		b.Fatal(err)
	}
	if err := l.LoadScripts(context.Background()); err != nil {
		b.Fatal(err)
	}
	who := Principal{Tenant: "bench-" + randomHex(4), ID: "anonymous"}
	ctx := context.Background()
	params := map[string]any{"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250.0, "currency": "eur", "reason": "requested_by_customer"}
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(25) // 50 goroutines on 2 CPUs
	start := processCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := "wf-" + strconv.FormatInt(n.Add(1), 10) + ":refund"
			if _, err := l.Reserve(ctx, who, ReserveRequest{OperationID: id, Tool: "payments.refund",
				Params: params, PermitID: "approval-77", Holder: "h-1"}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(processCPU(b)-start)/1e3/float64(b.N), "cpu-µs/op")
}

// processCPU returns the CPU time this process has used, in ns.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkLookup reads one SUCCEEDED operation with its history.
func BenchmarkLookup(b *testing.B) {
	l, who := benchLedger(b)
	ctx := context.Background()
	res, err := l.Reserve(ctx, who, ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := l.Complete(ctx, who, CompleteRequest{OperationID: "op", FencingToken: res.Operation.FencingToken,
		Outcome: OutcomeSucceeded, Result: &Result{Data: []byte(`{"id":"r-1"}`)}}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Lookup(ctx, who, "op"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStoredFormOfAnOutcome checks what a record keeps of a Complete: a
// terminal one leaves its expiry to the retention (empty exp) unless
// retain_until reaches further, stores '=' for the outcome digest and
// drops the lease and recovery window; a retryable failure keeps the
// digest and the policy. Lookup reads the same times either way, a repeat
// of the report is accepted, another report under the same token is a
// conflict, and neither changes the stored record.
func TestStoredFormOfAnOutcome(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		later := time.Now().Add(30 * 24 * time.Hour).Truncate(time.Millisecond)
		for _, c := range []struct {
			name      string
			retain    time.Time
			out       Outcome
			r         *Result
			f         *Failure
			other     *Result // another report under the same token
			otherF    *Failure
			state     State
			keptExp   bool // exp written out
			terminal  bool
			expiresAt func(o *Operation) time.Time
		}{
			{name: "succeeded", out: OutcomeSucceeded, r: &Result{Data: []byte(`{"refund":"re_1"}`), ResourceID: "re_1"},
				other: &Result{ResourceID: "re_2"}, state: StateSucceeded, terminal: true,
				expiresAt: func(o *Operation) time.Time { return o.UpdatedAt.Add(DefaultPolicy.Retention) }},
			{name: "failed", out: OutcomeFailedFinal, f: &Failure{Code: "declined", Message: "card declined"},
				otherF: &Failure{Code: "declined", Message: "another message"}, state: StateFailedFinal, terminal: true,
				expiresAt: func(o *Operation) time.Time { return o.UpdatedAt.Add(DefaultPolicy.Retention) }},
			{name: "detailed", out: OutcomeFailedFinal, f: &Failure{Code: "tool_error", Detail: "card 4242 declined"},
				otherF: &Failure{Code: "tool_error", Detail: "card 4242 expired"}, state: StateFailedFinal, terminal: true,
				expiresAt: func(o *Operation) time.Time { return o.UpdatedAt.Add(DefaultPolicy.Retention) }},
			{name: "retained", retain: later, out: OutcomeSucceeded, r: &Result{ResourceID: "re_1"},
				other: &Result{ResourceID: "re_2"}, state: StateSucceeded, terminal: true, keptExp: true,
				expiresAt: func(*Operation) time.Time { return later.Add(DefaultPolicy.RetainGrace) }},
			{name: "retryable", out: OutcomeFailedRetryable, f: &Failure{Code: "timeout"},
				otherF: &Failure{Code: "other"}, state: StatePending,
				expiresAt: func(*Operation) time.Time { return time.Time{} }},
		} {
			res, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: c.name, Tool: "payments.refund", PermitID: "p", RetainUntil: c.retain})
			if err != nil || res.Decision != DecisionExecute {
				t.Fatalf("%s: Reserve = %v, %v", c.name, res, err)
			}
			tok := res.Operation.FencingToken
			if _, err := e.complete(t, c.name, tok, c.out, c.r, c.f); err != nil {
				t.Fatalf("%s: Complete: %v", c.name, err)
			}
			key := e.opKeys(c.name).all[0]
			s, _ := e.stored(t, key)
			body, _, _ := strings.Cut(s[33:], "\xfe")
			f := append(strings.Split(body, "\xff"), make([]string, numFields)...)
			if got := f[fExp] != ""; got != c.keptExp {
				t.Errorf("%s: exp %q stored, want written out: %v", c.name, f[fExp], c.keptExp)
			}
			if c.terminal && (f[fCdg] != "=" || f[fLms] != "" || f[fRwin] != "") {
				t.Errorf("%s: cdg %q, lms %q, rwin %q; want =, none, none", c.name, f[fCdg], f[fLms], f[fRwin])
			}
			if !c.terminal && (len(f[fCdg]) != 16 || f[fLms] == "" || f[fRwin] == "") {
				t.Errorf("%s: cdg %q, lms %q, rwin %q; want a digest and the policy", c.name, f[fCdg], f[fLms], f[fRwin])
			}
			o := e.lookup(t, c.name)
			if o.State != c.state || !o.ExpiresAt.Equal(c.expiresAt(o)) {
				t.Errorf("%s: Lookup: %v, expires %v; want %v, %v", c.name, o.State, o.ExpiresAt, c.state, c.expiresAt(o))
			}
			if c.f != nil && c.terminal && (o.Failure == nil || *o.Failure != *c.f || o.Result != nil) {
				t.Errorf("%s: Lookup: failure %+v, result %+v; want %+v and no result", c.name, o.Failure, o.Result, *c.f)
			}
			if _, err := e.complete(t, c.name, tok, c.out, c.r, c.f); err != nil {
				t.Errorf("%s: the repeat: %v, want OK", c.name, err)
			}
			_, err = e.complete(t, c.name, tok, c.out, c.other, c.otherF)
			wantKind(t, err, KindCompletionConflict)
			if after, _ := e.stored(t, key); after != s {
				t.Errorf("%s: the repeat or the conflict changed the record", c.name)
			}
		}
	})
}

// TestNewRecordTail creates operations of every shape a new record takes
// and checks that what ledgerd encoded (newRecord.tail) is the stored form
// the scripts write: the scripts' own encoder, run on the record as
// load() reads it, gives back the same bytes, and the snapshot carries
// every field the Reserve asked for.
func TestNewRecordTail(t *testing.T) {
	reencode := redis.NewScript(commonLua + "\nbegin()\nif not load() then return false end\nreturn F.encode()\n")
	eachBackend(t, func(t *testing.T, e *env) {
		e.charged(t, "charge-1")
		later := time.Now().Add(90 * 24 * time.Hour).Truncate(time.Millisecond)
		for _, c := range []struct {
			name string
			req  ReserveRequest
		}{
			{name: "plain", req: ReserveRequest{Tool: "payments.refund", PermitID: "approval-77", Holder: "h-1"}},
			{name: "no permit, holder made up", req: ReserveRequest{Tool: "tickets.open"}},
			{name: "effect and run", req: ReserveRequest{Tool: "payments.refund", Effect: EffectIdempotent, RunID: "run-1", Step: 7}},
			{name: "retained", req: ReserveRequest{Tool: "payments.refund", RetainUntil: later}},
			{name: "retained in 1970", req: ReserveRequest{Tool: "payments.refund", RetainUntil: time.UnixMilli(1)}},
			{name: "consequential fields", req: ReserveRequest{Tool: "fields.charge", Params: map[string]any{"amount": 5.0, "currency": "eur"}}},
			{name: "compensates", req: ReserveRequest{Tool: "payments.refund", Compensates: "charge-1"}},
		} {
			c.req.OperationID = c.name
			res, err := e.l.Reserve(e.ctx, e.who, c.req)
			if err != nil || res.Decision != DecisionExecute {
				t.Fatalf("%s: Reserve = %v, %v", c.name, res, err)
			}
			k := e.opKeys(c.name)
			s, _ := e.stored(t, k.all[0])
			again, err := reencode.Run(e.ctx, e.rdb, k.all[:1], e.who.ID, k.member).Text()
			if err != nil || again != s {
				t.Errorf("%s: stored %q, the scripts encode it as %q (%v)", c.name, s, again, err)
			}
			o := res.Operation
			if o.Tool != c.req.Tool || o.PermitID != c.req.PermitID || o.RunID != c.req.RunID || o.Step != c.req.Step ||
				!o.RetainUntil.Equal(c.req.RetainUntil) || o.Compensates != c.req.Compensates ||
				o.State != StateRunning || o.Attempt != 1 || o.FencingToken != uint64(o.CreatedAt.UnixMilli()) ||
				!o.UpdatedAt.Equal(o.CreatedAt) || o.Reason != "RESERVED" || o.Holder != res.Holder {
				t.Errorf("%s: Reserve answered %+v for %+v", c.name, o, c.req)
			}
			if c.req.Effect != EffectUnspecified && o.Effect != c.req.Effect {
				t.Errorf("%s: effect %v, want %v", c.name, o.Effect, c.req.Effect)
			}
			if h := e.lookup(t, c.name).History; len(h) != 1 || h[0].Reason != "RESERVED" || h[0].Principal != e.who.ID ||
				h[0].Attempt != 1 || h[0].FencingToken != o.FencingToken || !h[0].Time.Equal(o.CreatedAt) || h[0].From != StateUnspecified || h[0].To != StateRunning {
				t.Errorf("%s: history %+v", c.name, h)
			}
		}
	})
}

// FuzzNewRecordTail: whatever values a Reserve validated, the new record
// ledgerd encodes decodes to them.
func FuzzNewRecordTail(f *testing.F) {
	f.Add("payments.refund", "approval-77", "h-1", "run-1", "agent-1", "", uint32(7), int64(1764750000000), int64(604800000), int64(30000), 5)
	f.Add("t", "", "h", "", "", "c", uint32(0), int64(0), int64(0), int64(1), 1)
	f.Fuzz(func(t *testing.T, tool, permit, holder, run, principal, compensates string, step uint32, retain, grace, lease int64, maxAttempts int) {
		for _, s := range []string{tool, permit, holder, run, principal, compensates} {
			if !utf8.ValidString(s) || strings.ContainsAny(s, "\x01") {
				return // the ledger refuses it
			}
		}
		if lease <= 0 || grace < 0 || maxAttempts < 1 || retain < 0 || retain > 1<<50 || grace > 1<<40 || lease > 1<<40 {
			return // no policy or request has it
		}
		n := newRecord{effect: EffectIrreversible, tool: tool, permit: permit, holder: holder, maxAttempts: maxAttempts,
			lease: time.Duration(lease) * time.Millisecond, retention: 7 * 24 * time.Hour, tombstone: 30 * 24 * time.Hour,
			recovery: 15 * time.Minute, run: run, step: step, retainMS: retain, retainEndMS: retain + grace,
			compensates: compensates, principal: principal}
		const ct = 1764750000000
		o, hist, err := decodeRecord("L" + strings.Repeat("f", 32) + "2\xff\xff" + strconv.FormatInt(ct, 36) + n.tail())
		if err != nil {
			t.Fatal(err)
		}
		want := time.UnixMilli(ct).UTC()
		if o.Tool != tool || o.PermitID != permit || o.Holder != holder || o.RunID != run || o.Step != step ||
			o.Compensates != compensates || int(o.MaxAttempts) != maxAttempts || o.State != StateRunning ||
			o.Attempt != 1 || o.FencingToken != ct || !o.CreatedAt.Equal(want) || !o.UpdatedAt.Equal(want) ||
			!o.LeaseExpiresAt.Equal(want.Add(n.lease)) || !o.RetainUntil.Equal(msTime(retain)) || o.Reason != "RESERVED" {
			t.Fatalf("decoded %+v from %+v", o, n)
		}
		h := parseHistory(hist, o.CreatedAt)
		if len(h) != 1 || h[0].Principal != principal || h[0].Reason != "RESERVED" || !h[0].Time.Equal(want) || h[0].FencingToken != ct {
			t.Fatalf("history %+v from %+v", h, n)
		}
	})
}
