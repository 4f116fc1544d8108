package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// TestReconcileSnapshot: reconcile prints the record its own call left,
// with the history from Reconcile's answer, and reads nothing else: an
// agent that claims the operation again right after a not-applied finding
// does not turn what is printed into "not-applied → RUNNING". Against a
// ledger whose answer has no history, ledgerctl reads the record with
// Lookup for it.
func TestReconcileSnapshot(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		e := newLedgerEnv(t, rdb)
		ctx := context.Background()

		id := "wf-1:refund"
		e.markUnknown(t, id, "payments.refund", "gateway timeout")
		p, addr := startProxy(t, e.addr, false)
		p.afterReconcile = func() {
			r, err := e.sdk.Reserve(ctx, client.Op{ID: id, Tool: "payments.refund", PermitID: "approval-1", RunID: "run-1", Step: 2,
				Params: map[string]any{"amount": 1250}}, client.NewHolder())
			if err != nil || r.Decision != client.DecisionExecute {
				t.Errorf("Reserve after the finding = %+v, %v", r, err)
			}
		}
		env := map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"]}
		o := must(t, env, "reconcile", id, "not-applied", "--note", "no refund at the bank")
		if !strings.HasPrefix(o.stdout, "reconciled "+id+": not-applied → PENDING\n") ||
			!strings.Contains(o.stdout, "state              PENDING") ||
			!strings.Contains(o.stdout, "RECONCILED_NOT_APPLIED") || !strings.Contains(o.stdout, "no refund at the bank") ||
			strings.Contains(o.stdout, "CLAIMED") {
			t.Errorf("reconcile not-applied, then a claim:\n%s", o)
		}
		if _, lookups := p.take(); lookups != 0 {
			t.Errorf("reconcile called Lookup %d times, want none", lookups)
		}

		// A ledger that answers without the history.
		old := "wf-2:refund"
		e.markUnknown(t, old, "payments.refund", "gateway timeout")
		p, addr = startProxy(t, e.addr, true)
		env = map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"]}
		o = must(t, env, "reconcile", old, "escalate", "--note", "finance must check")
		if !strings.HasPrefix(o.stdout, "reconciled "+old+": escalate → UNKNOWN (needs review)\n") ||
			!strings.Contains(o.stdout, "history (oldest first):") || !strings.Contains(o.stdout, "ESCALATED") ||
			!strings.Contains(o.stdout, "finance must check") {
			t.Errorf("reconcile escalate with an older ledger:\n%s", o)
		}
		if _, lookups := p.take(); lookups != 1 {
			t.Errorf("reconcile with an older ledger called Lookup %d times, want 1", lookups)
		}
	})
}

// TestHistoryUnreadable: against a ledger whose answer has no history, when
// reading the record again fails, the notice HISTORY_UNREADABLE says the
// operation was reconciled only when this call recorded its finding, not
// when it recorded nothing; and since Reconcile answered, it does not say
// the finding may have been recorded, as for a reconcile without an answer.
func TestHistoryUnreadable(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	ctx := context.Background()
	p, addr := startProxy(t, e.addr, true)
	p.lookupErr = status.Error(codes.Unavailable, "no lookup today")
	env := map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"]}

	// Recorded.
	id := "wf-90:refund"
	e.markUnknown(t, id, "payments.refund", "timeout")
	d := ctlJSON(t, env, "reconcile", id, "escalate", "--note", "finance must check")
	if d.Recorded == nil || !*d.Recorded || !slices.Equal(d.codes(), []string{"HISTORY_UNREADABLE"}) ||
		!strings.HasPrefix(d.Notices[0].Message, "reconciled, but could not read the history: ") ||
		strings.Contains(d.Notices[0].Message, "may have been recorded") {
		t.Errorf("a recorded finding: recorded %v, notices %+v", d.Recorded, d.Notices)
	}

	// Recorded nothing: applied with another result than the recorded one.
	done := "wf-91:refund"
	tok := e.reserve(t, done, "payments.refund")
	if _, err := e.sdk.Complete(ctx, done, tok, client.Result{ResourceID: "re_A"}); err != nil {
		t.Fatal(err)
	}
	d = ctlJSON(t, env, "reconcile", done, "applied", "--resource-id", "re_B")
	if d.Recorded == nil || *d.Recorded || !slices.Equal(d.codes(), []string{"NOTHING_RECORDED_OTHER_RESULT", "HISTORY_UNREADABLE"}) ||
		!strings.HasPrefix(d.Notices[1].Message, "this call recorded nothing, and could not read the history: ") ||
		strings.Contains(d.Notices[1].Message, "reconciled") || strings.Contains(d.Notices[1].Message, "may have been recorded") {
		t.Errorf("nothing recorded: recorded %v, notices %+v", d.Recorded, d.Notices)
	}
	o := must(t, env, "reconcile", done, "applied", "--resource-id", "re_B")
	if !strings.HasPrefix(o.stdout, "not reconciled "+done+": ") || !strings.Contains(o.stderr, "ledgerctl: this call recorded nothing, and could not read the history: ") ||
		strings.Contains(o.stderr, "reconciled, but") {
		t.Errorf("nothing recorded, without --json: %s", o)
	}
	if _, lookups := p.take(); lookups != 3 {
		t.Errorf("Lookup called %d times, want 3 (once a reconcile)", lookups)
	}
	if op, err := e.sdk.Lookup(ctx, done); err != nil || op.Result == nil || op.Result.ResourceID != "re_A" {
		t.Errorf("after the calls: %+v, %v", op, err)
	}
}

// TestReconcileOtherOutcomeUnreadable: the ledger refuses applied with
// another result than the one that stands (abandon with another failure)
// with ALREADY_RESOLVED, and ledgerctl reads the record to show what
// stands. When that read fails, the refusal is the error (exit 1), and its
// hint says that the operation holds another result (failure), which
// stands, and that nothing was recorded; another finding gets the plain
// hint, without a read.
func TestReconcileOtherOutcomeUnreadable(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	ctx := context.Background()
	p, addr := startProxy(t, e.addr, false)
	p.lookupErr = status.Error(codes.Unavailable, "no lookup today")
	env := map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"]}

	done, failed := "wf-95:refund", "wf-96:refund"
	tok := e.reserve(t, done, "payments.refund")
	if _, err := e.sdk.Complete(ctx, done, tok, client.Result{ResourceID: "re_A"}); err != nil {
		t.Fatal(err)
	}
	tok = e.reserve(t, failed, "payments.refund")
	if _, err := e.sdk.Fail(ctx, failed, tok, true, client.Failure{Code: "CARD_DECLINED"}); err != nil {
		t.Fatal(err)
	}
	fails(t, env, 1, []string{"ledgerctl: ALREADY_RESOLVED: ",
		"it is SUCCEEDED with another result than this finding's, which stands: nothing was recorded; see ledgerctl lookup " + done},
		"reconcile", done, "applied", "--resource-id", "re_B")
	o := fails(t, env, 1, []string{`"reason":"ALREADY_RESOLVED"`,
		`"hint":"it is FAILED_FINAL with another failure than this finding's, which stands: nothing was recorded; see ledgerctl lookup ` + failed + `"`},
		"--json", "reconcile", failed, "abandon", "--failure-code", "REFUNDED_BY_HAND")
	if o.stdout != "" {
		t.Errorf("a refusal printed a record: %s", o)
	}
	if _, lookups := p.take(); lookups != 2 {
		t.Errorf("Lookup called %d times, want 2 (once a refusal of the record's own kind)", lookups)
	}
	fails(t, env, 1, []string{"ledgerctl: ALREADY_RESOLVED: ", "it is SUCCEEDED: see ledgerctl lookup " + done}, "reconcile", done, "abandon")
	if _, lookups := p.take(); lookups != 0 {
		t.Errorf("Lookup called %d times for another finding, want 0", lookups)
	}
	if op, err := e.sdk.Lookup(ctx, done); err != nil || op.Result == nil || op.Result.ResourceID != "re_A" {
		t.Errorf("after the calls: %+v, %v", op, err)
	}
}

// TestReconcileOtherFailureThenSucceeded: abandon with another failure on
// an ABANDONED operation is refused; before ledgerctl reads the record to
// show the failure that stands, the attempt's late report of success turns
// it SUCCEEDED. ledgerctl must not print that record as "already
// FAILED_FINAL with another failure": the refusal is the error (exit 1).
func TestReconcileOtherFailureThenSucceeded(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	ctx := context.Background()
	p, addr := startProxy(t, e.addr, false)
	env := map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"]}

	id := "wf-97:refund"
	tok := e.reserve(t, id, "payments.refund")
	if _, err := e.sdk.MarkUnknown(ctx, id, tok, "timeout"); err != nil {
		t.Fatal(err)
	}
	must(t, env, "reconcile", id, "abandon", "--failure-code", "GONE")
	p.afterRefusal = func() {
		p.afterRefusal = nil
		if _, err := e.sdk.Complete(ctx, id, tok, client.Result{ResourceID: "re_late"}); err != nil {
			t.Error(err)
		}
	}
	o := fails(t, env, 1, []string{"ledgerctl: ALREADY_RESOLVED: ", "see ledgerctl lookup " + id}, "reconcile", id, "abandon", "--failure-code", "OTHER")
	if o.stdout != "" || strings.Contains(o.stderr, "recorded nothing: the operation was already FAILED_FINAL") {
		t.Errorf("the record read after the refusal, SUCCEEDED, shown as the failure that stands: %s", o)
	}
	if op, err := e.sdk.Lookup(ctx, id); err != nil || op.State != client.StateSucceeded {
		t.Errorf("after the late report: %+v, %v", op, err)
	}
}

// TestReconcileNotReplicatedMayBeRecorded: a reconcile answered
// NOT_REPLICATED ran on the primary, which may hold the finding now while
// its replicas do not: like a reconcile without an answer, the hint says
// the finding may have been recorded and that the same command again is
// the safe retry, not another finding or note. Other commands get no such
// hint.
func TestReconcileNotReplicatedMayBeRecorded(t *testing.T) {
	err := &client.Error{Code: codes.Unavailable, Reason: "NOT_REPLICATED", Metadata: map[string]string{"acknowledged": "0"},
		Message: "the call ran on the primary (what it wrote stands there) but fewer replicas than required acknowledged it; retry the same call"}
	d := describe(&options{cmd: "reconcile", args: []string{"wf-1:refund"}}, err)
	for _, want := range []string{"may have been recorded", "ledgerctl lookup wf-1:refund", "run the same command again"} {
		if !strings.Contains(d.Hint, want) {
			t.Errorf("reconcile answered NOT_REPLICATED: the hint lacks %q: %+v", want, d)
		}
	}
	if d := describe(&options{cmd: "lookup", args: []string{"wf-1:refund"}}, err); strings.Contains(d.Hint, "recorded") {
		t.Errorf("lookup answered NOT_REPLICATED: %+v", d)
	}
}
