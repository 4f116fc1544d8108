package ledger

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A call repeated after the record moved on (a go-redis re-send, or a
// client's retry of a call whose answer was lost) is recognised from the
// history: it answers OK when it took effect and changes nothing. A
// reconciler's finding names its attempt, so a late repeat never resolves
// the next attempt: the duplicate below cannot happen.
func TestRepeatAfterTheRecordMovedOn(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		params := map[string]any{"amount": 10.0}

		t.Run("reconcile names its attempt", func(t *testing.T) {
			applied := 0 // the destination's count of refunds for this operation
			id := "fenced-reconcile"
			first := e.execute(t, id, "payments.refund") // attempt 1: the refund does not happen
			if _, err := e.markUnknown(t, id, first.FencingToken); err != nil {
				t.Fatal(err)
			}
			notApplied := ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: first.FencingToken}
			if o, err := e.l.Reconcile(e.ctx, e.who, notApplied); err != nil || o.State != StatePending {
				t.Fatalf("Reconcile(not applied, attempt 1) = %v, %v; want PENDING", o, err)
			}
			second := e.reserve(t, id, "payments.refund", params, "h2")
			if second.Decision != DecisionExecute || second.Operation.Attempt != 2 {
				t.Fatalf("Reserve = %v attempt %d, want EXECUTE attempt 2", second.Decision, second.Operation.Attempt)
			}
			applied++ // attempt 2 refunds, and its answer is lost
			if _, err := e.markUnknown(t, id, second.Operation.FencingToken); err != nil {
				t.Fatal(err)
			}
			before := e.lookup(t, id)

			// The reconciler's call about attempt 1 arrives again.
			o, err := e.l.Reconcile(e.ctx, e.who, notApplied)
			if err != nil {
				t.Fatalf("repeated Reconcile(not applied, attempt 1): %v, want OK (it took effect)", err)
			}
			if o.State != StateUnknown || o.Attempt != 2 {
				t.Fatalf("after the repeat: %v attempt %d, want UNKNOWN attempt 2", o.State, o.Attempt)
			}
			// A finding about attempt 1 that was never recorded is stale.
			_, err = e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingEscalate, FencingToken: first.FencingToken})
			if ke := wantKind(t, err, KindStaleToken); ke.State != StateUnknown {
				t.Fatalf("stale Reconcile: state %v, want UNKNOWN", ke.State)
			}
			after := e.lookup(t, id)
			if got, want := reasons(after), reasons(before); len(got) != len(want) {
				t.Fatalf("history %v, want it unchanged: %v", got, want)
			}
			// An agent retries: it must be told to reconcile, not to refund
			// a second time.
			e.retryMustReconcile(t, id, "payments.refund", params, "h3", &applied)
			if applied != 1 {
				t.Fatalf("the refund was applied %d times, want 1", applied)
			}
			// The finding about attempt 2 settles it.
			o, err = e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingApplied,
				Result: &Result{ResourceID: "re_2"}, FencingToken: second.Operation.FencingToken})
			if err != nil || o.State != StateSucceeded {
				t.Fatalf("Reconcile(applied, attempt 2) = %v, %v", o, err)
			}
		})

		t.Run("reconcile of a live claim's predecessor", func(t *testing.T) {
			id := "fenced-live"
			first := e.execute(t, id, "payments.refund")
			if _, err := e.complete(t, id, first.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
				t.Fatal(err)
			}
			if r := e.reserve(t, id, "payments.refund", params, "h2"); r.Decision != DecisionExecute {
				t.Fatalf("Reserve = %v, want EXECUTE", r.Decision)
			}
			_, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingAbandon, FencingToken: first.FencingToken})
			wantKind(t, err, KindStaleToken)
			if o := e.lookup(t, id); o.State != StateRunning || o.Attempt != 2 {
				t.Fatalf("after a stale Reconcile: %v attempt %d, want RUNNING attempt 2", o.State, o.Attempt)
			}
		})

		t.Run("complete retryable", func(t *testing.T) {
			id := "repeat-complete"
			first := e.execute(t, id, "payments.refund")
			if _, err := e.complete(t, id, first.FencingToken, OutcomeFailedRetryable, nil, &Failure{Code: "declined"}); err != nil {
				t.Fatal(err)
			}
			second := e.reserve(t, id, "payments.refund", params, "h2")
			if second.Decision != DecisionExecute {
				t.Fatalf("Reserve = %v, want EXECUTE", second.Decision)
			}
			before := e.lookup(t, id)
			o, err := e.complete(t, id, first.FencingToken, OutcomeFailedRetryable, nil, &Failure{Code: "declined"})
			if err != nil {
				t.Fatalf("repeated Complete(retryable, attempt 1): %v, want OK", err)
			}
			if o.State != StateRunning || o.FencingToken != second.Operation.FencingToken {
				t.Fatalf("after the repeat: %v token %d, want attempt 2's claim untouched", o.State, o.FencingToken)
			}
			// Another outcome under attempt 1's token is stale, not accepted.
			_, err = e.complete(t, id, first.FencingToken, OutcomeSucceeded, &Result{ResourceID: "re_1"}, nil)
			wantKind(t, err, KindStaleToken)
			if got, want := reasons(e.lookup(t, id)), reasons(before); len(got) != len(want) {
				t.Fatalf("history %v, want it unchanged: %v", got, want)
			}
			if o, err := e.complete(t, id, second.Operation.FencingToken, OutcomeSucceeded, &Result{ResourceID: "re_2"}, nil); err != nil || o.State != StateSucceeded {
				t.Fatalf("Complete(attempt 2) = %v, %v", o, err)
			}
		})

		t.Run("mark unknown", func(t *testing.T) {
			id := "repeat-unknown"
			first := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, first.FencingToken); err != nil {
				t.Fatal(err)
			}
			if _, err := e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: first.FencingToken}); err != nil {
				t.Fatal(err)
			}
			second := e.reserve(t, id, "payments.refund", params, "h2")
			if second.Decision != DecisionExecute {
				t.Fatalf("Reserve = %v, want EXECUTE", second.Decision)
			}
			o, err := e.markUnknown(t, id, first.FencingToken)
			if err != nil {
				t.Fatalf("repeated MarkUnknown(attempt 1): %v, want OK", err)
			}
			if o.State != StateRunning || o.Attempt != 2 {
				t.Fatalf("after the repeat: %v attempt %d, want RUNNING attempt 2", o.State, o.Attempt)
			}
			// Tokens that never marked anything are stale, whatever their size.
			for _, tok := range []uint64{first.FencingToken - 1, 1, math.MaxUint64} {
				_, err = e.markUnknown(t, id, tok)
				wantKind(t, err, KindStaleToken)
				_, err = e.complete(t, id, tok, OutcomeFailedRetryable, nil, nil)
				wantKind(t, err, KindStaleToken)
				_, err = e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: tok})
				wantKind(t, err, KindStaleToken)
			}
		})
	})
}

// A call repeated while its token is still the current one, after other
// calls changed the record, is recognised from the history as well: it
// answers OK and changes nothing, so it cannot undo what came after it.
// Each case counts the effects at the destination where one could be
// applied twice.
func TestRepeatUndoesNothingThatCameAfter(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		params := map[string]any{"amount": 10.0}

		t.Run("reconcile after the worker reported unknown", func(t *testing.T) {
			applied := 0
			id := "reconcile-then-unknown"
			first := e.execute(t, id, "expiring.refund") // irreversible, 150 ms lease
			waitLeaseExpiry()
			e.sweep(t) // LEASE_EXPIRED: UNKNOWN
			notApplied := ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: first.FencingToken, Note: "no refund at the bank"}
			if o, err := e.l.Reconcile(e.ctx, e.who, notApplied); err != nil || o.State != StatePending {
				t.Fatalf("Reconcile(not applied) = %v, %v; want PENDING", o, err) // its answer is lost
			}
			applied++ // the slow worker's refund lands after the reconciler looked
			if o, err := e.markUnknown(t, id, first.FencingToken); err != nil || o.State != StateUnknown {
				t.Fatalf("MarkUnknown = %v, %v; want UNKNOWN", o, err)
			}
			before := reasons(e.lookup(t, id))

			// The reconciler's call arrives again.
			o, err := e.l.Reconcile(e.ctx, e.who, notApplied)
			if err != nil || o.State != StateUnknown {
				t.Fatalf("repeated Reconcile(not applied) = %v, %v; want OK, still UNKNOWN", o, err)
			}
			if got := reasons(e.lookup(t, id)); len(got) != len(before) {
				t.Fatalf("history %v, want it unchanged: %v", got, before)
			}
			e.retryMustReconcile(t, id, "expiring.refund", params, "h2", &applied)
			if applied != 1 {
				t.Fatalf("the refund was applied %d times, want 1", applied)
			}
			// A new look at the destination is a new call: it says so in
			// its note, and settles the operation.
			o, err = e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: FindingApplied,
				FencingToken: first.FencingToken, Note: "refund found on second look", Result: &Result{ResourceID: "re_1"}})
			if err != nil || o.State != StateSucceeded {
				t.Fatalf("Reconcile(applied) = %v, %v; want SUCCEEDED", o, err)
			}
		})

		t.Run("a new finding about the same attempt", func(t *testing.T) {
			applied := 0
			id := "reconcile-again"
			first := e.execute(t, id, "expiring.refund")
			waitLeaseExpiry()
			e.sweep(t)
			look := func(note string, who Principal) *Operation {
				t.Helper()
				o, err := e.l.Reconcile(e.ctx, who, ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: first.FencingToken, Note: note})
				if err != nil {
					t.Fatalf("Reconcile(not applied, %q by %s): %v", note, who.ID, err)
				}
				return o
			}
			look("first look", e.who)
			// The worker, still out, cannot tell; the refund never happened.
			if _, err := e.markUnknown(t, id, first.FencingToken); err != nil {
				t.Fatal(err)
			}
			if o := look("first look", e.who); o.State != StateUnknown {
				t.Fatalf("the same call again: %v, want UNKNOWN (a repeat)", o.State)
			}
			// Another reconciler's look, or this one's with a new note, is a
			// new finding: the operation may run again, once.
			other := Principal{Tenant: e.who.Tenant, ID: "reconciler-2"}
			if o := look("first look", other); o.State != StatePending {
				t.Fatalf("another principal's finding: %v, want PENDING", o.State)
			}
			if r := e.reserve(t, id, "expiring.refund", params, "h2"); r.Decision == DecisionExecute {
				applied++
			}
			if applied != 1 {
				t.Fatalf("the refund was applied %d times, want 1", applied)
			}
		})

		// An unfenced finding the history holds about an earlier attempt
		// only is no repeat of a call about this one: answering OK would
		// say it took effect when it touched nothing, and applying it
		// would let a lost answer's retry return attempt 2, whose refund
		// may exist, to PENDING. It is refused and changes nothing; the
		// finding about attempt 2 names its token.
		for name, f := range map[string]Finding{"not applied": FindingNotApplied, "escalate": FindingEscalate} {
			t.Run("unfenced "+name+" after the next attempt", func(t *testing.T) {
				applied := 0
				id := "unfenced-reconcile-" + name
				first := e.execute(t, id, "payments.refund")
				if _, err := e.markUnknown(t, id, first.FencingToken); err != nil {
					t.Fatal(err)
				}
				unfenced := ReconcileRequest{OperationID: id, Finding: f} // no fencing_token
				if _, err := e.l.Reconcile(e.ctx, e.who, unfenced); err != nil {
					t.Fatal(err)
				}
				if f == FindingEscalate {
					// A human finds nothing at the destination.
					human := ReconcileRequest{OperationID: id, Finding: FindingNotApplied, Note: "checked by hand", FencingToken: first.FencingToken}
					if _, err := e.l.Reconcile(e.ctx, e.who, human); err != nil {
						t.Fatal(err)
					}
				}
				second := e.reserve(t, id, "payments.refund", params, "h2")
				if second.Decision != DecisionExecute {
					t.Fatalf("Reserve = %v, want EXECUTE", second.Decision)
				}
				applied++ // attempt 2 refunds, and cannot tell
				if _, err := e.markUnknown(t, id, second.Operation.FencingToken); err != nil {
					t.Fatal(err)
				}
				before := e.lookup(t, id)
				_, err := e.l.Reconcile(e.ctx, e.who, unfenced) // a lost answer's retry, or a new call with the old note
				wantKind(t, err, KindStaleToken)
				if o := e.lookup(t, id); o.State != StateUnknown || o.Attempt != 2 || o.NeedsReview || len(o.History) != len(before.History) {
					t.Fatalf("after the refused Reconcile: %v", o)
				}
				e.retryMustReconcile(t, id, "payments.refund", params, "h3", &applied)
				if applied != 1 {
					t.Fatalf("the refund was applied %d times, want 1", applied)
				}
				fenced := unfenced
				fenced.FencingToken = second.Operation.FencingToken
				o, err := e.l.Reconcile(e.ctx, e.who, fenced)
				if err != nil || o.Attempt != 2 || f == FindingNotApplied && o.State != StatePending || f == FindingEscalate && !o.NeedsReview {
					t.Fatalf("the finding about attempt 2 with its token = %v, %v", o, err)
				}
			})
		}

		t.Run("complete after the ledger concluded", func(t *testing.T) {
			id := "complete-after-abandon"
			first := e.execute(t, id, "expiring.refund")
			waitLeaseExpiry()
			if o, err := e.reconcile(t, id, FindingAbandon, nil); err != nil || o.State != StateFailedFinal {
				t.Fatalf("Reconcile(abandon) = %v, %v", o, err)
			}
			if _, err := e.complete(t, id, first.FencingToken, OutcomeFailedFinal, nil, &Failure{Code: "declined"}); err != nil {
				t.Fatalf("Complete(FAILED_FINAL) agreeing with the abandon: %v, want OK", err)
			}
			if _, err := e.complete(t, id, first.FencingToken, OutcomeFailedFinal, nil, &Failure{Code: "declined"}); err != nil {
				t.Fatalf("its repeat: %v, want OK", err)
			}
			_, err := e.complete(t, id, first.FencingToken, OutcomeSucceeded, &Result{ResourceID: "re_1"}, nil)
			wantKind(t, err, KindCompletionConflict)
			if o := e.lookup(t, id); o.State != StateFailedFinal {
				t.Fatalf("after a contradicting Complete: %v, history %v; want FAILED_FINAL", o.State, reasons(o))
			}
		})

		t.Run("mark unknown after a reconciler's finding", func(t *testing.T) {
			id := "unknown-then-reconciled"
			first := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, first.FencingToken); err != nil { // its answer is lost
				t.Fatal(err)
			}
			if o, err := e.reconcile(t, id, FindingNotApplied, nil); err != nil || o.State != StatePending {
				t.Fatalf("Reconcile(not applied) = %v, %v", o, err)
			}
			before := reasons(e.lookup(t, id))
			o, err := e.markUnknown(t, id, first.FencingToken) // the worker's retry
			if err != nil || o.State != StatePending {
				t.Fatalf("repeated MarkUnknown = %v, %v; want OK, still PENDING", o, err)
			}
			if got := reasons(e.lookup(t, id)); len(got) != len(before) {
				t.Fatalf("history %v, want it unchanged: %v", got, before)
			}
		})

		t.Run("mark unknown after the lease ran out, repeated after a finding", func(t *testing.T) {
			id := "expired-unknown-then-reconciled"
			first := e.execute(t, id, "expiring.refund")
			waitLeaseExpiry()
			e.sweep(t) // LEASE_EXPIRED: UNKNOWN before the worker says so

			// The worker's MarkUnknown; its answer is lost.
			if o, err := e.markUnknown(t, id, first.FencingToken); err != nil || o.State != StateUnknown {
				t.Fatalf("MarkUnknown on UNKNOWN = %v, %v", o, err)
			}
			if got := reasons(e.lookup(t, id)); got[len(got)-1] != "MARKED_UNKNOWN" {
				t.Fatalf("history %v, want the worker's report recorded", got)
			}
			finding := ReconcileRequest{OperationID: id, Finding: FindingNotApplied, FencingToken: first.FencingToken, Note: "no refund at the bank"}
			if o, err := e.l.Reconcile(e.ctx, e.who, finding); err != nil || o.State != StatePending {
				t.Fatalf("Reconcile(not applied) = %v, %v", o, err)
			}
			before := reasons(e.lookup(t, id))
			o, err := e.markUnknown(t, id, first.FencingToken) // the worker's retry
			if err != nil || o.State != StatePending {
				t.Fatalf("repeated MarkUnknown = %v, %v; want OK, still PENDING", o, err)
			}
			if got := reasons(e.lookup(t, id)); len(got) != len(before) {
				t.Fatalf("history %v, want it unchanged: %v", got, before)
			}
			// The finding stands: the next call runs the refund (no attempt
			// ever applied it).
			if r := e.reserve(t, id, "expiring.refund", params, "h2"); r.Decision != DecisionExecute {
				t.Fatalf("Reserve after the finding = %v, want EXECUTE", r.Decision)
			}
		})

		t.Run("retryable failure reported while pending", func(t *testing.T) {
			id := "retryable-from-pending"
			first := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, first.FencingToken); err != nil {
				t.Fatal(err)
			}
			if _, err := e.reconcile(t, id, FindingNotApplied, nil); err != nil {
				t.Fatal(err)
			}
			fail := &Failure{Code: "503"}
			if o, err := e.complete(t, id, first.FencingToken, OutcomeFailedRetryable, nil, fail); err != nil || o.State != StatePending {
				t.Fatalf("Complete(retryable) from PENDING = %v, %v", o, err) // its answer is lost
			}
			if got := reasons(e.lookup(t, id)); got[len(got)-1] != "FAILED_RETRYABLE" {
				t.Fatalf("history %v, want the report recorded", got)
			}
			second := e.reserve(t, id, "payments.refund", params, "h2")
			if second.Decision != DecisionExecute {
				t.Fatalf("Reserve = %v, want EXECUTE", second.Decision)
			}
			o, err := e.complete(t, id, first.FencingToken, OutcomeFailedRetryable, nil, fail)
			if err != nil || o.State != StateRunning || o.FencingToken != second.Operation.FencingToken {
				t.Fatalf("repeated Complete(retryable) = %v, %v; want OK, attempt 2's claim untouched", o, err)
			}
		})
	})
}

// lossyProxy forwards Redis traffic and, when armed, lets the next FCALL
// reach Redis but cuts the connection instead of returning its reply: the
// client sees a lost response and go-redis sends the script again, exactly
// as after a read timeout.
type lossyProxy struct {
	ln    net.Listener
	to    string
	armed atomic.Bool
	cuts  atomic.Int32
	wg    sync.WaitGroup
}

func newLossyProxy(t *testing.T, to string) *lossyProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{ln: ln, to: to}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { _ = ln.Close(); p.wg.Wait() })
	return p
}

func (p *lossyProxy) addr() string { return p.ln.Addr().String() }

func (p *lossyProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		var script atomic.Bool
		go func() { // client -> server
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if bytes.Contains(bytes.ToUpper(buf[:n]), []byte("FCALL")) && p.armed.Load() {
						script.Store(true)
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = s.Close()
					return
				}
			}
		}()
		go func() { // server -> client
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if script.Load() && p.armed.CompareAndSwap(true, false) {
						// The script ran; its reply is lost.
						p.cuts.Add(1)
						_ = c.Close()
						_ = s.Close()
						return
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = c.Close()
					return
				}
			}
		}()
	}
}

// fcallCalls returns how many FCALL the Redis of c ran.
func fcallCalls(t *testing.T, c *redis.Client) int { return commandCalls(t, c, "fcall") }

// commandCalls returns how many times the Redis of c ran cmd (INFO
// commandstats).
func commandCalls(t *testing.T, c *redis.Client, cmd string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// TestScriptsSafeWhenResent cuts the reply of every kind of write script, so
// go-redis sends it a second time, and checks the outcome equals one run: no
// second attempt, no second history entry.
func TestScriptsSafeWhenResent(t *testing.T) {
	srv := redistest.Start(t)
	direct := srv.Client(t)
	proxy := newLossyProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.addr(), DisableIdentity: true, MaxRetries: 3})
	t.Cleanup(func() { _ = rdb.Close() })
	pol, _ := ParsePolicies([]byte(ledgertest.Policy))
	e := newEnv(t, rdb, pol)
	if err := e.l.LoadScripts(e.ctx); err != nil { // so every call is one FCALL
		t.Fatal(err)
	}

	// resent runs call with the reply of its script cut once.
	resent := func(name string, call func() error) {
		t.Helper()
		before := fcallCalls(t, direct)
		proxy.armed.Store(true)
		if err := call(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if proxy.armed.Load() {
			t.Fatalf("%s: no reply was cut", name)
		}
		if runs := fcallCalls(t, direct) - before; runs < 2 {
			t.Fatalf("%s: the script ran %d times, want 2 (sent again)", name, runs)
		}
	}
	params := map[string]any{"amount": 10.0}
	req := ReserveRequest{OperationID: "op", Tool: "payments.refund", Params: params, PermitID: "p", Holder: "h1"}

	var first *ReserveResult
	resent("Reserve (create)", func() (err error) { first, err = e.l.Reserve(e.ctx, e.who, req); return })
	if first.Decision != DecisionExecute || first.Operation.Attempt != 1 {
		t.Fatalf("Reserve = %v %+v", first.Decision, first.Operation)
	}
	resent("Complete (retryable)", func() error {
		_, err := e.complete(t, "op", first.Operation.FencingToken, OutcomeFailedRetryable, nil, nil)
		return err
	})
	var second *ReserveResult
	resent("Reserve (claim)", func() (err error) { second, err = e.l.Reserve(e.ctx, e.who, req); return })
	if second.Decision != DecisionExecute || second.Operation.Attempt != 2 {
		t.Fatalf("claim = %v %+v", second.Decision, second.Operation)
	}
	resent("Renew", func() error {
		_, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "op", FencingToken: second.Operation.FencingToken})
		return err
	})
	resent("MarkUnknown", func() error { _, err := e.markUnknown(t, "op", second.Operation.FencingToken); return err })
	resent("Reconcile (escalate)", func() error { _, err := e.reconcile(t, "op", FindingEscalate, nil); return err })
	resent("Reconcile (not applied)", func() error { _, err := e.reconcile(t, "op", FindingNotApplied, nil); return err })
	var third *ReserveResult
	resent("Reserve (claim again)", func() (err error) { third, err = e.l.Reserve(e.ctx, e.who, req); return })
	resent("Complete (succeeded)", func() error {
		_, err := e.complete(t, "op", third.Operation.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil)
		return err
	})

	got := e.lookup(t, "op")
	want := []string{"RESERVED", "FAILED_RETRYABLE", "CLAIMED", "MARKED_UNKNOWN", "ESCALATED", "RECONCILED_NOT_APPLIED", "CLAIMED", "SUCCEEDED"}
	if strings.Join(reasons(got), ",") != strings.Join(want, ",") || got.Attempt != 3 {
		t.Fatalf("attempt %d, history %v; want attempt 3, history %v", got.Attempt, reasons(got), want)
	}
	if proxy.cuts.Load() != 9 {
		t.Fatalf("%d replies cut, want 9", proxy.cuts.Load())
	}
}

// dump reads everything the ledger stores about a tenant, to compare before
// and after a refused call.
func dump(t *testing.T, e *env) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := e.rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		v, err := e.rdb.Dump(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

// TestOutOfMemoryRefusesBeforeFirstWrite puts Redis over maxmemory
// (noeviction) and checks that every write script is refused whole: the
// caller gets KindUnavailable and not one key changes. Once memory is
// available the same calls succeed.
func TestOutOfMemoryRefusesBeforeFirstWrite(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	rdb := srv.Client(t)
	pol, _ := ParsePolicies([]byte(ledgertest.Policy))
	e := newEnv(t, rdb, pol)
	if err := e.l.LoadScripts(e.ctx); err != nil {
		t.Fatal(err)
	}
	running := e.execute(t, "running", "payments.refund")
	pending := e.execute(t, "pending", "payments.refund")
	if _, err := e.complete(t, "pending", pending.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
		t.Fatal(err)
	}
	before := dump(t, e)

	if err := rdb.ConfigSet(e.ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Reserve (create)": func() error {
			_, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "new", Tool: "payments.refund", PermitID: "p", Holder: "h"})
			return err
		},
		"Reserve (claim)": func() error {
			_, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "pending", Tool: "payments.refund", Params: map[string]any{"amount": 10.0}, PermitID: "permit-1", Holder: "h"})
			return err
		},
		"Complete": func() error {
			_, err := e.complete(t, "running", running.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil)
			return err
		},
		"MarkUnknown": func() error { _, err := e.markUnknown(t, "running", running.FencingToken); return err },
		"Renew": func() error {
			_, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "running", FencingToken: running.FencingToken})
			return err
		},
		"Reconcile": func() error { _, err := e.reconcile(t, "pending", FindingAbandon, nil); return err },
	}
	for name, call := range calls {
		err := call()
		if KindOf(err) != KindUnavailable || !strings.Contains(err.Error(), "OOM") {
			t.Fatalf("%s under OOM: %v, want KindUnavailable (OOM)", name, err)
		}
	}
	after := dump(t, e)
	if len(after) != len(before) {
		t.Fatalf("keys before %d, after %d", len(before), len(after))
	}
	for k, v := range before {
		if after[k] != v {
			t.Fatalf("key %s changed under OOM", k)
		}
	}
	// Reads still work.
	if _, err := e.l.Lookup(e.ctx, e.who, "running"); err != nil {
		t.Fatalf("Lookup under OOM: %v", err)
	}

	if err := rdb.ConfigSet(e.ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Complete", "Reserve (create)"} {
		if err := calls[name](); err != nil {
			t.Fatalf("%s after OOM: %v", name, err)
		}
	}
	if got := reasons(e.lookup(t, "running")); !slices.Equal(got, []string{"RESERVED", "SUCCEEDED"}) {
		t.Fatalf("history = %v", got)
	}
}

// BenchmarkScriptParts measures what parts of the scripts cost Redis, by
// Redis's own account (INFO commandstats, µs per EVALSHA or FCALL): an empty
// script, the common prelude alone, a function of a library with that
// prelude doing nothing but begin() (what a call by FCALL runs of it), and the prelude with helpers of the write path
// run 200 times, reported per run of the helper (redis-µs/op). A fresh
// redis-server; run it alone: go test ./ledger -run '^$' -bench ScriptParts.
func BenchmarkScriptParts(b *testing.B) {
	rdb := redistest.Start(b).Client(b)
	ctx := context.Background()
	// A RUNNING record as a new Reserve leaves it, before it is encoded.
	const record = `
R.tool, R.fp, R.pmt, R.eff = 'payments.refund', string.rep('f', 32), 'approval-77', '3'
R.lms, R.max, R.ret, R.tret, R.rwin = '30s', '5', '7d', '30d', '15m'
R.ct = tostr(NOW); R.att = '1'; R.tok = tostr(NOW); R.hld = 'h'; R.lse = tostr(NOW + 30000)
R.st, R.rsn, R.ut = '2', 'RESERVED', R.ct
local REC = F.encode()
`
	const loops = 200
	for _, c := range []struct {
		name, lua string
		loop, fn  bool
	}{
		{"empty script", "return 1", false, false},
		{"prelude", commonLua + "\nbegin()\nreturn 1", false, false},
		{"function with the prelude", "return 1", false, true},
		{"load of a missing record", "load()", true, false},
		{"load of a stored record", "load(REC)", true, false},
		{"encode", "S.ct36 = nil; F.encode()", true, false},
		{"history entry", "S.hist = ''; F.history(nil, '2', 'RESERVED', '')", true, false},
		{"base36", "F.base36(NOW)", true, false},
		{"redis.call EXISTS", "redis.call('EXISTS', KEYS[1])", true, false},
	} {
		src := c.lua
		if c.loop {
			src = commonLua + "\nbegin()\n" + record + "\nfor i = 1, " + strconv.Itoa(loops) + " do " + c.lua + " end\nreturn 1"
		}
		empty := commonLua + "\nbegin()\n" + record + "\nfor i = 1, " + strconv.Itoa(loops) + " do end\nreturn 1"
		b.Run(c.name, func(b *testing.B) {
			per := func(src string, n int) float64 {
				s := newScript("parts", commonLua, src)
				stat := "cmdstat_fcall:"
				if c.fn {
					if err := rdb.FunctionLoadReplace(ctx, buildLibrary([]*script{s})).Err(); err != nil {
						b.Fatal(err)
					}
				} else {
					s.Script, stat = redis.NewScript(src), "cmdstat_evalsha:"
					if err := s.Load(ctx, rdb).Err(); err != nil {
						b.Fatal(err)
					}
				}
				if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				for range n {
					by := wayEvalSha
					if c.fn {
						by = wayFCall
					}
					if err := s.send(ctx, rdb, by, []string{"bench:none"}, []any{"agent-1", "default:wf-1"}).Err(); err != nil {
						b.Fatal(err)
					}
				}
				for _, line := range strings.Split(rdb.Info(ctx, "commandstats").Val(), "\r\n") {
					if v, ok := strings.CutPrefix(line, stat); ok {
						for _, f := range strings.Split(v, ",") {
							if u, ok := strings.CutPrefix(f, "usec_per_call="); ok {
								n, _ := strconv.ParseFloat(u, 64)
								return n
							}
						}
					}
				}
				b.Fatal("no " + stat + " in commandstats")
				return 0
			}
			base := 0.0
			if c.loop {
				base = per(empty, 300)
			}
			b.ResetTimer()
			got := per(src, b.N)
			if c.loop {
				got = (got - base) / loops
			}
			b.ReportMetric(got, "redis-µs/op")
		})
	}
}

// inPlaceGuard is the line of complete.lua that takes the in-place way.
const inPlaceGuard = "if stored and (outcome == '1' or outcome == '2') then"

// movedInMs is a script's reply as text, its moved field's time in ms
// however the script wrote it (recordFromReply reads both forms alike).
func movedInMs(reply any) string {
	r, ok := reply.([]any)
	if !ok || len(r) < 4 {
		return fmt.Sprint(reply)
	}
	r = slices.Clone(r)
	if m, _ := r[3].(string); m != "" {
		st, d, _ := strings.Cut(m, ":")
		r[3] = st + ":" + strconv.FormatInt(millis(d), 10)
	}
	return fmt.Sprint(r)
}

// TestCompleteInPlace: a Complete recorded in place (complete.lua,
// in_place) leaves the same record, TTL, indexes and reply as load() and
// finish() do at the same store time, for every shape of record it takes
// and for the ones it leaves to them. Each case's operation is copied to a
// second keyspace; one script then completes the copy the generic way and
// the original in place, with one clock.
func TestCompleteInPlace(t *testing.T) {
	generic := strings.Replace(completeLua, inPlaceGuard, "if false then", 1)
	if generic == completeLua {
		t.Fatalf("complete.lua has no line %q", inPlaceGuard)
	}
	const taken = "if done then\n    return done"
	fast := strings.Replace(completeLua, taken, "if done then\n    took = 1\n    return done", 1)
	if fast == completeLua {
		t.Fatalf("complete.lua has no lines %q", taken)
	}
	both := redis.NewScript(commonLua + "\nlocal took = 0\nlocal function in_place_way()\n" + fast + "\nend\nlocal function generic_way()\n" + generic + `
end
begin()
local now, a = NOW, {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}
local fast = in_place_way()
for i = 1, 5 do KEYS[i] = KEYS[i + 5] end
begin()
NOW = now
local slow = generic_way()
for i = 1, 5 do KEYS[i] = a[i] end
return {fast, slow, took}
`)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	pol, err := ParsePolicies([]byte(ledgertest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, rdb, pol)
	other := newKeyspace("inplace")
	result := &Result{Data: []byte(`{"id":"re_1"}`), ResourceID: "re_1"}
	failure := &Failure{Code: "card_declined", Message: "the card was declined"}
	// retried claims attempt n of id after n-1 retryable failures.
	retried := func(t *testing.T, id string, n int) uint64 {
		tok := e.execute(t, id, "retried.refund").FencingToken
		for i := 1; i < n; i++ {
			if _, err := e.complete(t, id, tok, OutcomeFailedRetryable, nil, failure); err != nil {
				t.Fatal(err)
			}
			tok = e.execute(t, id, "retried.refund").FencingToken
		}
		return tok
	}
	reserve := func(t *testing.T, req ReserveRequest) uint64 {
		req.Holder, req.PermitID = "h-"+req.OperationID, "permit-1"
		if req.Params == nil {
			req.Params = map[string]any{"amount": 10.0, "currency": "eur"}
		}
		res, err := e.l.Reserve(e.ctx, e.who, req)
		if err != nil || res.Decision != DecisionExecute {
			t.Fatalf("Reserve(%s) = %v, %v", req.OperationID, res, err)
		}
		return res.Operation.FencingToken
	}
	for _, c := range []struct {
		name    string
		claim   func(t *testing.T, id string) uint64 // the token to report with
		outcome Outcome
		r       *Result
		f       *Failure
		by      string // the reporting principal's id, when not the env's
		code    int64  // the script's code
		generic bool   // in_place leaves the record to the generic way
	}{
		{name: "succeeded", claim: func(t *testing.T, id string) uint64 { return e.execute(t, id, "payments.refund").FencingToken },
			outcome: OutcomeSucceeded, r: result},
		{name: "id:with/reserved%bytes,ü", claim: func(t *testing.T, id string) uint64 { return e.execute(t, id, "payments.refund").FencingToken },
			outcome: OutcomeSucceeded, r: result},
		{name: "a result without a resource id", claim: func(t *testing.T, id string) uint64 { return e.execute(t, id, "payments.refund").FencingToken },
			outcome: OutcomeSucceeded, r: &Result{Data: []byte(`{"ok":true}`)}},
		{name: "succeeded without a result", claim: func(t *testing.T, id string) uint64 { return e.execute(t, id, "payments.refund").FencingToken },
			outcome: OutcomeSucceeded},
		{name: "failed for good", claim: func(t *testing.T, id string) uint64 { return e.execute(t, id, "payments.refund").FencingToken },
			outcome: OutcomeFailedFinal, f: failure},
		{name: "failed with a detail", claim: func(t *testing.T, id string) uint64 { return e.execute(t, id, "payments.refund").FencingToken },
			outcome: OutcomeFailedFinal, f: &Failure{Code: "tool_error", Detail: "card 4242 declined:\n{\"retry\": false}"}},
		{name: "by another principal", claim: func(t *testing.T, id string) uint64 { return e.execute(t, id, "payments.refund").FencingToken },
			outcome: OutcomeSucceeded, r: result, by: "agent-2"},
		{name: "third attempt", claim: func(t *testing.T, id string) uint64 { return retried(t, id, 3) },
			outcome: OutcomeSucceeded, r: result},
		{name: "24 attempts: 47 entries", claim: func(t *testing.T, id string) uint64 { return retried(t, id, 24) },
			outcome: OutcomeSucceeded, r: result, generic: true},
		{name: "26 attempts: the oldest entry goes", claim: func(t *testing.T, id string) uint64 { return retried(t, id, 26) },
			outcome: OutcomeFailedFinal, f: failure, generic: true},
		{name: "consequential fields", claim: func(t *testing.T, id string) uint64 {
			return reserve(t, ReserveRequest{OperationID: id, Tool: "fields.refund"})
		}, outcome: OutcomeSucceeded, r: result},
		{name: "in a run", claim: func(t *testing.T, id string) uint64 {
			if _, err := e.l.StartRun(e.ctx, e.who, "run-"+id, RunLimits{MaxSteps: 5}); err != nil {
				t.Fatal(err)
			}
			return reserve(t, ReserveRequest{OperationID: id, Tool: "payments.refund", RunID: "run-" + id, Step: 4})
		}, outcome: OutcomeSucceeded, r: result},
		{name: "compensating", claim: func(t *testing.T, id string) uint64 {
			charge := e.execute(t, "charge-"+id, "payments.charge")
			if _, err := e.complete(t, "charge-"+id, charge.FencingToken, OutcomeSucceeded, result, nil); err != nil {
				t.Fatal(err)
			}
			return reserve(t, ReserveRequest{OperationID: id, Tool: "payments.refund", Compensates: "charge-" + id})
		}, outcome: OutcomeSucceeded, r: result},
		{name: "retained until", claim: func(t *testing.T, id string) uint64 {
			return reserve(t, ReserveRequest{OperationID: id, Tool: "payments.refund", RetainUntil: time.Now().Add(30 * 24 * time.Hour)})
		}, outcome: OutcomeSucceeded, r: result, generic: true},
		{name: "after its lease", claim: func(t *testing.T, id string) uint64 {
			o := e.execute(t, id, "expiring.idempotent")
			e.waitLeaseEnd(t, o)
			e.sweep(t) // lists the claim as overdue
			if n := rdb.ZCard(e.ctx, e.opKeys(id).all[4]).Val(); n != 1 {
				t.Fatalf("%d overdue after the sweep, want 1", n)
			}
			return o.FencingToken
		}, outcome: OutcomeSucceeded, r: result},
		{name: "retryable", claim: func(t *testing.T, id string) uint64 { return e.execute(t, id, "payments.refund").FencingToken },
			outcome: OutcomeFailedRetryable, f: failure, generic: true},
		{name: "stale token", claim: func(t *testing.T, id string) uint64 { return e.execute(t, id, "payments.refund").FencingToken - 1 },
			outcome: OutcomeSucceeded, r: result, code: codeStale, generic: true},
		{name: "a repeat", claim: func(t *testing.T, id string) uint64 {
			tok := e.execute(t, id, "payments.refund").FencingToken
			if _, err := e.complete(t, id, tok, OutcomeSucceeded, result, nil); err != nil {
				t.Fatal(err)
			}
			return tok
		}, outcome: OutcomeSucceeded, r: result, generic: true},
		{name: "unknown", claim: func(t *testing.T, id string) uint64 {
			tok := e.execute(t, id, "payments.refund").FencingToken
			if _, err := e.markUnknown(t, id, tok); err != nil {
				t.Fatal(err)
			}
			return tok
		}, outcome: OutcomeSucceeded, r: result, generic: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := "op-" + strings.ReplaceAll(c.name, " ", "-")
			tok := c.claim(t, id)
			a, b := e.opKeys(id), other.op(e.who.Tenant, id)
			for i := range a.all {
				if err := rdb.Copy(e.ctx, a.all[i], b.all[i], 0, true).Err(); err != nil {
					t.Fatal(err)
				}
			}
			r, f := storedOutcome(c.r, c.f)
			by := cmp.Or(c.by, e.who.ID)
			out, err := both.Run(e.ctx, rdb, append(slices.Clone(a.all), b.all...),
				by, a.member, tok, int(c.outcome), outcomeDigest(c.outcome, r, f), r.Data, r.ResourceID, f.Code, f.Message, id).Slice()
			if err != nil {
				t.Fatal(err)
			}
			if movedInMs(out[0]) != movedInMs(out[1]) {
				t.Fatalf("replies differ:\nin place %q\ngeneric  %q", out[0], out[1])
			}
			if code := out[0].([]any)[0].(int64); code != c.code {
				t.Fatalf("code %d, want %d: %q", code, c.code, out[0])
			}
			if took := out[2].(int64) == 1; took == c.generic {
				t.Errorf("recorded in place: %v, want %v", took, !c.generic)
			}
			for i := range a.all {
				if x, y := keyDump(t, rdb, a.all[i]), keyDump(t, rdb, b.all[i]); x != y {
					t.Errorf("%s differs:\nin place %q\ngeneric  %q", a.all[i], x, y)
				}
			}
			ta, tb := rdb.PTTL(e.ctx, a.all[0]).Val(), rdb.PTTL(e.ctx, b.all[0]).Val()
			if d := ta - tb; d < -time.Second || d > time.Second {
				t.Errorf("TTL in place %v, generic %v", ta, tb)
			}
		})
	}
}

// keyDump returns a key's value as text: a string, a hash's fields or a sorted
// set's members with their scores, in order.
func keyDump(t *testing.T, rdb redis.UniversalClient, key string) string {
	t.Helper()
	ctx := context.Background()
	switch typ := rdb.Type(ctx, key).Val(); typ {
	case "string":
		return rdb.Get(ctx, key).Val()
	case "hash":
		m := rdb.HGetAll(ctx, key).Val()
		keys := slices.Sorted(maps.Keys(m))
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "%s=%s;", k, m[k])
		}
		return b.String()
	case "zset":
		return fmt.Sprint(rdb.ZRangeWithScores(ctx, key, 0, -1).Val())
	default:
		return typ
	}
}
