package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// out is what one run of ledgerctl printed.
type out struct {
	code           int
	stdout, stderr string
}

func (o out) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", o.code, o.stdout, o.stderr)
}

// ctl runs ledgerctl with args and the environment env.
func ctl(t *testing.T, env map[string]string, args ...string) out {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr, func(k string) string { return env[k] })
	return out{code, stdout.String(), stderr.String()}
}

// must runs ledgerctl and fails the test unless it exits 0.
func must(t *testing.T, env map[string]string, args ...string) out {
	t.Helper()
	o := ctl(t, env, args...)
	if o.code != 0 {
		t.Fatalf("ledgerctl %q: %s", args, o)
	}
	return o
}

// fails runs ledgerctl and fails the test unless it exits code with every
// want on stderr.
func fails(t *testing.T, env map[string]string, code int, want []string, args ...string) out {
	t.Helper()
	o := ctl(t, env, args...)
	if o.code != code {
		t.Fatalf("ledgerctl %q: want exit %d: %s", args, code, o)
	}
	for _, w := range want {
		if !strings.Contains(o.stderr, w) {
			t.Fatalf("ledgerctl %q: stderr lacks %q: %s", args, w, o)
		}
	}
	return o
}

// lookupJSON runs lookup --json and decodes the record.
func lookupJSON(t *testing.T, env map[string]string, id string) jsonOperation {
	t.Helper()
	o := must(t, env, "lookup", "--json", id)
	var op jsonOperation
	if err := json.Unmarshal([]byte(o.stdout), &op); err != nil {
		t.Fatalf("lookup --json: %v\n%s", err, o.stdout)
	}
	return op
}

// listIDs runs list-unresolved --json with extra flags and returns the ids.
func listIDs(t *testing.T, env map[string]string, flags ...string) ([]string, jsonList) {
	t.Helper()
	o := must(t, env, append([]string{"list-unresolved", "--json"}, flags...)...)
	var l jsonList
	if err := json.Unmarshal([]byte(o.stdout), &l); err != nil {
		t.Fatalf("list-unresolved --json: %v\n%s", err, o.stdout)
	}
	ids := []string{}
	for _, op := range l.Operations {
		ids = append(ids, op.OperationID)
	}
	if l.Count != len(ids) {
		t.Fatalf("count %d, %d operations", l.Count, len(ids))
	}
	return ids, l
}

// tableIDs returns the first column of a table's rows (not the header).
func tableIDs(stdout string) []string {
	ids := []string{}
	for i, line := range strings.Split(strings.TrimRight(stdout, "\n"), "\n") {
		if i == 0 || line == "" {
			continue
		}
		ids = append(ids, strings.Fields(line)[0])
	}
	return ids
}

// keyring makes API keys of a tenant of the test's own.
type keyring struct {
	tenant string
	doc    strings.Builder
	keys   map[string]string // by scope
}

func newKeyring(t *testing.T, scopes ...string) *keyring {
	t.Helper()
	k := &keyring{tenant: "t-" + client.NewHolder()[2:14], keys: map[string]string{}}
	k.doc.WriteString("keys:\n")
	for _, s := range scopes {
		id := s + "-" + k.tenant
		key, hash, err := server.NewAPIKey(id)
		if err != nil {
			t.Fatal(err)
		}
		k.keys[s] = key
		k.doc.WriteString("  - {id: " + id + ", tenant: " + k.tenant + ", scopes: [" + s + "], secret_sha256: " + hash + "}\n")
	}
	return k
}

func (k *keyring) creds(t *testing.T, extra string) *server.Credentials {
	t.Helper()
	c, err := server.ParseCredentials([]byte(k.doc.String() + extra))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ledgerEnv is a ledger with a tenant of its own, an SDK client of it, and
// the environment ledgerctl gets.
type ledgerEnv struct {
	addr string
	keys *keyring
	sdk  *client.Client
	env  map[string]string
}

func newLedgerEnv(t *testing.T, rdb redis.UniversalClient) *ledgerEnv {
	t.Helper()
	keys := newKeyring(t, "agent", "reconciler", "viewer")
	st := servicetest.Start(t, rdb, servicetest.Options{Policy: ledgertest.Policy, Credentials: keys.creds(t, "")})
	sdk, err := client.Dial(st.Addr, client.WithAPIKey(keys.keys["agent"]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sdk.Close() })
	return &ledgerEnv{addr: st.Addr, keys: keys, sdk: sdk,
		env: map[string]string{"LEDGER_ADDR": st.Addr, "LEDGER_API_KEY": keys.keys["reconciler"]}}
}

// reserve reserves a new operation and returns its fencing token.
func (e *ledgerEnv) reserve(t *testing.T, id, tool string) uint64 {
	t.Helper()
	r, err := e.sdk.Reserve(context.Background(), client.Op{ID: id, Tool: tool, PermitID: "approval-1", RunID: "run-1", Step: 2,
		Params: map[string]any{"amount": 1250}}, client.NewHolder())
	if err != nil || r.Decision != client.DecisionExecute {
		t.Fatalf("Reserve %s = %+v, %v", id, r, err)
	}
	// Operations list oldest first by creation time in milliseconds: keep
	// them apart.
	time.Sleep(3 * time.Millisecond)
	return r.Operation.FencingToken
}

func (e *ledgerEnv) markUnknown(t *testing.T, id, tool, why string) {
	t.Helper()
	tok := e.reserve(t, id, tool)
	if _, err := e.sdk.MarkUnknown(context.Background(), id, tok, why); err != nil {
		t.Fatal(err)
	}
}

// waitOverdue waits until the store's clock, read from rdb, has passed the
// recovery deadline of the UNKNOWN operation id: from then on the ledger
// selects it as overdue.
func (e *ledgerEnv) waitOverdue(t *testing.T, rdb redis.UniversalClient, id string) {
	t.Helper()
	ctx := context.Background()
	op, err := e.sdk.Lookup(ctx, id)
	if err != nil || op.RecoveryDeadline.IsZero() {
		t.Fatalf("Lookup %s = %+v, %v", id, op, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !now.Before(op.RecoveryDeadline) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store's clock %v never reached the recovery deadline %v of %s", now, op.RecoveryDeadline, id)
		}
	}
}

// TestOperatorWorkflow finds and resolves operations end to end: lookup,
// list-unresolved with its filters, and each reconcile finding.
func TestOperatorWorkflow(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		e := newLedgerEnv(t, rdb)
		env := e.env
		ctx := context.Background()

		// One operation in each state.
		running := "wf-1:create-ticket"
		e.reserve(t, running, "tickets.create")

		unknown := "wf-1:refund"
		e.markUnknown(t, unknown, "payments.refund", "gateway timeout")

		pending := "wf-2:refund"
		tok := e.reserve(t, pending, "payments.refund")
		if _, err := e.sdk.Fail(ctx, pending, tok, false, client.Failure{Code: "RATE_LIMITED", Message: "429 before acceptance"}); err != nil {
			t.Fatal(err)
		}

		late := "wf-3:charge"
		e.markUnknown(t, late, "overdue.charge", "read timeout")

		done := "wf-4:create-ticket"
		tok = e.reserve(t, done, "tickets.create")
		if _, err := e.sdk.Complete(ctx, done, tok, client.Result{ResourceID: "TCK-1", Data: map[string]any{"url": "https://t/1"}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // past the 1ms recovery window of overdue.*

		// lookup: the block and the history table.
		o := must(t, env, "lookup", unknown)
		for _, want := range []string{
			"operation          wf-1:refund", "state              UNKNOWN", "reason             MARKED_UNKNOWN",
			"effect             IRREVERSIBLE", "attempt            1 of 3", "permit             approval-1",
			"run                run-1 (step 2)", "needs review       no", "lease expires      -",
			"history (oldest first):", "TIME", "FROM → TO",
			"- → RUNNING", "RESERVED", "RUNNING → UNKNOWN", "MARKED_UNKNOWN", "gateway timeout",
			"agent-" + e.keys.tenant, // the principal
		} {
			if !strings.Contains(o.stdout, want) {
				t.Errorf("lookup lacks %q:\n%s", want, o.stdout)
			}
		}
		if op, err := e.sdk.Lookup(ctx, unknown); err != nil || !strings.Contains(o.stdout, "history head       "+op.HistoryHead+"\n") {
			t.Errorf("lookup lacks the history head (%v):\n%s", err, o.stdout)
		}
		if lines := strings.Split(strings.TrimSpace(o.stdout[strings.Index(o.stdout, "history (oldest first)"):]), "\n"); len(lines) != 4 {
			t.Errorf("history table: want a title, a header and 2 rows:\n%s", o.stdout)
		}
		o = must(t, env, "lookup", pending)
		if !strings.Contains(o.stdout, "failure            RATE_LIMITED: 429 before acceptance") ||
			!strings.Contains(o.stdout, "RUNNING → PENDING") {
			t.Errorf("lookup of the pending one:\n%s", o.stdout)
		}
		o = must(t, env, "lookup", late)
		if !strings.Contains(o.stdout, "OVERDUE by") {
			t.Errorf("lookup of the overdue one:\n%s", o.stdout)
		}

		// lookup --json: the documented fields.
		op := lookupJSON(t, env, done)
		if op.State != "STATE_SUCCEEDED" || op.Result == nil || op.Result.ResourceID != "TCK-1" || op.Result.Data["url"] != "https://t/1" ||
			op.Tool != "tickets.create" || op.Effect != "EFFECT_IRREVERSIBLE" || op.Attempt != 1 || op.MaxAttempts != 3 ||
			len(op.ParamsSHA256) != 64 || op.ExpiresAt == nil || op.CreatedAt == nil || op.LeaseExpiresAt != nil || len(op.History) != 2 ||
			op.History[1].FromState != "STATE_RUNNING" || op.History[1].ToState != "STATE_SUCCEEDED" || op.History[1].Reason != "SUCCEEDED" {
			t.Errorf("lookup --json of the succeeded one: %+v", op)
		}
		raw := must(t, env, "--json", "lookup", unknown).stdout
		var fields map[string]any
		if err := json.Unmarshal([]byte(raw), &fields); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"operation_id", "tool", "effect", "state", "reason", "attempt", "max_attempts", "fencing_token",
			"params_sha256", "permit_id", "run_id", "step", "result", "failure", "needs_review", "overdue", "created_at", "updated_at",
			"lease_expires_at", "unknown_since", "recovery_deadline", "retain_until", "expires_at", "history"} {
			if _, ok := fields[f]; !ok {
				t.Errorf("lookup --json lacks %q: %s", f, raw)
			}
		}
		for _, f := range []string{"time", "from_state", "to_state", "attempt", "fencing_token", "principal", "reason", "detail"} {
			if _, ok := fields["history"].([]any)[0].(map[string]any)[f]; !ok {
				t.Errorf("lookup --json history lacks %q: %s", f, raw)
			}
		}

		// list-unresolved: exactly the unresolved ones (not the live
		// RUNNING one, not the SUCCEEDED one), oldest first.
		all := []string{unknown, pending, late}
		o = must(t, env, "list-unresolved")
		if got := tableIDs(o.stdout); !slices.Equal(got, all) {
			t.Errorf("list-unresolved = %q, want %q:\n%s", got, all, o.stdout)
		}
		header := strings.Fields(strings.SplitN(o.stdout, "\n", 2)[0])
		if strings.Join(header, " ") != "OPERATION TOOL STATE ATTEMPT AGE UNKNOWN SINCE RECOVERY DEADLINE NEEDS REVIEW" {
			t.Errorf("header %q", header)
		}
		for _, line := range strings.Split(o.stdout, "\n") {
			if strings.HasPrefix(line, late+" ") != strings.Contains(line, "OVERDUE") {
				t.Errorf("only %s is OVERDUE:\n%s", late, o.stdout)
			}
		}
		ids, l := listIDs(t, env)
		if !slices.Equal(ids, all) || l.Truncated {
			t.Errorf("list-unresolved --json = %q (truncated %v), want %q", ids, l.Truncated, all)
		}
		if u := l.Operations[0]; u.State != "STATE_UNKNOWN" || u.UnknownSince == nil || u.RecoveryDeadline == nil || u.Overdue ||
			u.History != nil || u.Attempt != 1 {
			t.Errorf("list --json entry: %+v", u)
		}
		if p := l.Operations[1]; p.State != "STATE_PENDING" || p.Failure == nil || p.Failure.Code != "RATE_LIMITED" || p.UnknownSince != nil {
			t.Errorf("list --json entry: %+v", p)
		}
		if !l.Operations[2].Overdue {
			t.Errorf("list --json: %s is not overdue: %+v", late, l.Operations[2])
		}
		// Times are RFC 3339 with milliseconds: the deadline is the 1ms
		// window after unknown_since.
		since, err1 := time.Parse(time.RFC3339, *l.Operations[2].UnknownSince)
		deadline, err2 := time.Parse(time.RFC3339, *l.Operations[2].RecoveryDeadline)
		if err1 != nil || err2 != nil || deadline.Sub(since) != time.Millisecond || len(*l.Operations[2].UnknownSince) != len("2006-01-02T15:04:05.000Z") {
			t.Errorf("times: %q, %q: %v, %v", *l.Operations[2].UnknownSince, *l.Operations[2].RecoveryDeadline, err1, err2)
		}

		// Filters.
		for _, c := range []struct {
			flags []string
			want  []string
		}{
			{[]string{"--state", "pending"}, []string{pending}},
			{[]string{"--state", "unknown,pending"}, all},
			{[]string{"--state", "UNKNOWN", "--state", "pending"}, all},
			{[]string{"--state", "unknown"}, []string{unknown, late}},
			{[]string{"--state", "running"}, []string{}},
			{[]string{"--tool", "payments.refund"}, []string{unknown, pending}},
			{[]string{"--tool", "overdue.charge", "--state", "unknown"}, []string{late}},
			{[]string{"--overdue"}, []string{late}},
			{[]string{"--overdue", "--state", "unknown,pending"}, []string{late}},
			{[]string{"--needs-review"}, []string{}},
			{[]string{"--limit", "2"}, []string{unknown, pending}},
		} {
			if ids, _ := listIDs(t, env, c.flags...); !slices.Equal(ids, c.want) {
				t.Errorf("list-unresolved %q = %q, want %q", c.flags, ids, c.want)
			}
		}
		o = must(t, env, "list-unresolved", "--overdue")
		if got := tableIDs(o.stdout); !slices.Equal(got, []string{late}) || !strings.Contains(o.stdout, "OVERDUE") {
			t.Errorf("list-unresolved --overdue:\n%s", o.stdout)
		}
		o = must(t, env, "list-unresolved", "--limit", "2")
		if got := tableIDs(o.stdout); !slices.Equal(got, all[:2]) || !strings.Contains(o.stderr, "more remain") {
			t.Errorf("list-unresolved --limit 2: %s", o)
		}
		if _, l := listIDs(t, env, "--limit", "2"); !l.Truncated {
			t.Errorf("--limit 2: not truncated")
		}
		if _, l := listIDs(t, env, "--limit", "3"); l.Truncated {
			t.Errorf("--limit 3: truncated")
		}
		o = must(t, env, "list-unresolved", "--needs-review")
		if o.stdout != "" || !strings.Contains(o.stderr, "no unresolved operations") {
			t.Errorf("list-unresolved --needs-review with none: %s", o)
		}

		// reconcile: a live claim is not reconciled.
		fails(t, env, 1, []string{"ledgerctl: OPERATION_IN_PROGRESS: ", "lease"}, "reconcile", running, "applied")

		// applied: UNKNOWN → SUCCEEDED with the result (flags after the
		// arguments, --addr as a flag instead of the environment).
		noAddr := map[string]string{"LEDGER_API_KEY": env["LEDGER_API_KEY"]}
		o = must(t, noAddr, "reconcile", unknown, "applied", "--resource-id", "re_1", "--data", `{"amount": 12.5, "status": "succeeded"}`,
			"--note", "found in the gateway's dashboard", "--addr", e.addr)
		if !strings.HasPrefix(o.stdout, "reconciled wf-1:refund: applied → SUCCEEDED\n") || !strings.Contains(o.stdout, "RECONCILED_APPLIED") {
			t.Errorf("reconcile applied:\n%s", o.stdout)
		}
		op = lookupJSON(t, env, unknown)
		last := op.History[len(op.History)-1]
		if op.State != "STATE_SUCCEEDED" || op.Reason != "RECONCILED_APPLIED" || op.Result == nil || op.Result.ResourceID != "re_1" ||
			op.Result.Data["amount"] != 12.5 || op.Result.Data["status"] != "succeeded" || op.UnknownSince != nil ||
			last.FromState != "STATE_UNKNOWN" || last.ToState != "STATE_SUCCEEDED" || last.Reason != "RECONCILED_APPLIED" ||
			last.Detail != "found in the gateway's dashboard" || last.Principal != "reconciler-"+e.keys.tenant {
			t.Errorf("after applied: %+v, last %+v", op, last)
		}
		// The same finding again is harmless; another one is refused.
		if o := must(t, env, "reconcile", unknown, "applied", "--resource-id", "re_1", "--data", `{"status": "succeeded", "amount": 12.5}`); o.stderr != "" {
			t.Errorf("the same finding again: %s", o)
		}
		fails(t, env, 1, []string{"ledgerctl: ALREADY_RESOLVED: ", "it is SUCCEEDED: see ledgerctl lookup " + unknown}, "reconcile", unknown, "abandon")

		// not-applied: UNKNOWN → PENDING, retry allowed (--json output),
		// fenced to the attempt looked up.
		attempt1 := strconv.FormatUint(lookupJSON(t, env, late).FencingToken, 10)
		o = must(t, env, "--json", "reconcile", late, "not-applied", "--note", "no charge at the bank", "--fencing-token", attempt1)
		if err := json.Unmarshal([]byte(o.stdout), &op); err != nil || op.State != "STATE_PENDING" || op.Reason != "RECONCILED_NOT_APPLIED" {
			t.Errorf("reconcile --json not-applied = %v: %s", err, o.stdout)
		}
		op = lookupJSON(t, env, late)
		last = op.History[len(op.History)-1]
		if op.State != "STATE_PENDING" || op.UnknownSince != nil || op.RecoveryDeadline != nil || op.Overdue ||
			last.FromState != "STATE_UNKNOWN" || last.ToState != "STATE_PENDING" || last.Detail != "no charge at the bank" {
			t.Errorf("after not-applied: %+v", op)
		}
		if r, err := e.sdk.Reserve(ctx, client.Op{ID: late, Tool: "overdue.charge", PermitID: "approval-1", Params: map[string]any{"amount": 1250}},
			client.NewHolder()); err != nil || r.Decision != client.DecisionExecute || r.Operation.Attempt != 2 {
			t.Errorf("Reserve after not-applied = %+v, %v", r, err)
		}
		// The same call again (a retry: finding, note and token) is
		// recognised; another one about attempt 1, now that attempt 2 holds
		// the operation, is refused and changes nothing: another finding,
		// or the same finding with another note.
		must(t, env, "reconcile", late, "not-applied", "--note", "no charge at the bank", "--fencing-token", attempt1)
		fails(t, env, 1, []string{"ledgerctl: STALE_FENCING_TOKEN: ", "another attempt holds the operation now"},
			"reconcile", late, "abandon", "--fencing-token", attempt1)
		fails(t, env, 1, []string{"ledgerctl: STALE_FENCING_TOKEN: "},
			"reconcile", late, "not-applied", "--note", "looked again", "--fencing-token", attempt1)
		if op = lookupJSON(t, env, late); op.State != "STATE_RUNNING" || op.Attempt != 2 {
			t.Errorf("after a stale finding: %+v", op)
		}

		// abandon: PENDING → FAILED_FINAL with the failure given.
		must(t, env, "reconcile", pending, "abandon", "--failure-code", "DUPLICATE_SUSPECTED", "--failure-message", "customer refunded by hand")
		op = lookupJSON(t, env, pending)
		if op.State != "STATE_FAILED_FINAL" || op.Reason != "ABANDONED" || op.Failure == nil || op.Failure.Code != "DUPLICATE_SUSPECTED" ||
			op.Failure.Message != "customer refunded by hand" || op.History[len(op.History)-1].Reason != "ABANDONED" {
			t.Errorf("after abandon: %+v", op)
		}
		// abandon without a failure: the code defaults to ABANDONED.
		bare := "wf-5:refund"
		e.markUnknown(t, bare, "payments.refund", "")
		must(t, env, "reconcile", bare, "abandon")
		if op = lookupJSON(t, env, bare); op.State != "STATE_FAILED_FINAL" || op.Failure == nil || op.Failure.Code != "ABANDONED" {
			t.Errorf("after a bare abandon: %+v", op)
		}

		// escalate: stays UNKNOWN, flagged for review.
		esc := "wf-6:refund"
		e.markUnknown(t, esc, "payments.refund", "gateway 504")
		o = must(t, env, "reconcile", esc, "escalate", "--note", "finance must check")
		if !strings.HasPrefix(o.stdout, "reconciled "+esc+": escalate → UNKNOWN (needs review)\n") || !strings.Contains(o.stdout, "needs review       yes") {
			t.Errorf("reconcile escalate:\n%s", o.stdout)
		}
		op = lookupJSON(t, env, esc)
		last = op.History[len(op.History)-1]
		if op.State != "STATE_UNKNOWN" || !op.NeedsReview || op.Reason != "ESCALATED" || op.UnknownSince == nil ||
			last.FromState != "STATE_UNKNOWN" || last.ToState != "STATE_UNKNOWN" || last.Detail != "finance must check" {
			t.Errorf("after escalate: %+v", op)
		}
		o = must(t, env, "list-unresolved", "--needs-review")
		if got := tableIDs(o.stdout); !slices.Equal(got, []string{esc}) || !strings.Contains(o.stdout, " yes") {
			t.Errorf("list-unresolved --needs-review:\n%s", o.stdout)
		}
		// Now unresolved: the escalated one only (late is RUNNING again
		// under a live lease).
		if ids, _ := listIDs(t, env); !slices.Equal(ids, []string{esc}) {
			t.Errorf("list-unresolved at the end = %q", ids)
		}

		// Errors name the reason, once, on stderr.
		o = fails(t, env, 1, nil, "lookup", "no-such-op")
		if !strings.HasPrefix(o.stderr, "ledgerctl: NOT_FOUND: no such operation; ") || strings.Count(o.stderr, "\n") != 1 || o.stdout != "" {
			t.Errorf("lookup of nothing: %s", o)
		}
		o = fails(t, env, 1, nil, "lookup", "--json", "no-such-op")
		var je jsonError
		if err := json.Unmarshal([]byte(o.stderr), &je); err != nil || je.Reason != "NOT_FOUND" || je.Code != "NOT_FOUND" || je.Error != "no such operation" {
			t.Errorf("lookup --json of nothing = %v: %s", err, o)
		}
		fails(t, env, 1, []string{"ledgerctl: INVALID_ARGUMENT: ", "note"}, "reconcile", esc, "escalate", "--note", strings.Repeat("n", 300))
		fails(t, env, 1, []string{"ledgerctl: DEADLINE_EXCEEDED: ", "--timeout 1ns"}, "lookup", esc, "--timeout", "1ns")
	})
}

// TestCredentials: keys from the flag and the environment, the scope each
// command needs, and the key never printed.
func TestCredentials(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		e := newLedgerEnv(t, rdb)
		id := "wf-9:refund"
		e.markUnknown(t, id, "payments.refund", "timeout")
		rec, agent, viewer := e.keys.keys["reconciler"], e.keys.keys["agent"], e.keys.keys["viewer"]
		wrong := strings.SplitN(rec, ".", 2)[0] + "." + strings.Repeat("0", 64)
		addr := map[string]string{"LEDGER_ADDR": e.addr}
		withKey := func(k string) map[string]string { return map[string]string{"LEDGER_ADDR": e.addr, "LEDGER_API_KEY": k} }

		var outs []out
		check := func(o out) out { outs = append(outs, o); return o }

		// The reconciler's key works from the flag and from the environment.
		check(must(t, addr, "list-unresolved", "--api-key", rec))
		check(must(t, withKey(rec), "list-unresolved"))
		check(must(t, addr, "--api-key="+rec, "lookup", id))
		// The viewer lists and looks up, but may not reconcile.
		check(must(t, withKey(viewer), "list-unresolved"))
		check(fails(t, withKey(viewer), 1, []string{"ledgerctl: PERMISSION_DENIED: ", "reconcile needs an API key with the reconciler scope"},
			"reconcile", id, "escalate"))
		// The agent looks up, but may neither list nor reconcile.
		check(must(t, withKey(agent), "lookup", id))
		check(fails(t, withKey(agent), 1, []string{"ledgerctl: PERMISSION_DENIED: ", "reconcile needs an API key with the reconciler scope"},
			"reconcile", id, "applied"))
		check(fails(t, withKey(agent), 1, []string{"ledgerctl: PERMISSION_DENIED: ", "list-unresolved needs an API key with the reconciler or viewer scope"},
			"list-unresolved"))
		o := check(fails(t, withKey(agent), 1, nil, "--json", "reconcile", id, "applied"))
		var je jsonError
		if err := json.Unmarshal([]byte(o.stderr), &je); err != nil || je.Reason != "PERMISSION_DENIED" || je.Code != "PERMISSION_DENIED" ||
			!strings.Contains(je.Hint, "reconciler scope") || je.Error == "" {
			t.Errorf("--json PERMISSION_DENIED = %v: %s", err, o)
		}
		// The flag wins over the environment.
		check(must(t, withKey(agent), "reconcile", id, "escalate", "--api-key", rec))
		// No key, a wrong key.
		check(fails(t, addr, 1, []string{"ledgerctl: UNAUTHENTICATED: ", "--api-key or LEDGER_API_KEY"}, "list-unresolved"))
		check(fails(t, withKey(wrong), 1, []string{"ledgerctl: UNAUTHENTICATED: ", "not revoked"}, "lookup", id))
		check(fails(t, addr, 1, []string{"ledgerctl: UNAUTHENTICATED: ", "not revoked"}, "lookup", id, "--api-key", wrong))
		// Nothing was reconciled by those refused.
		if op := lookupJSON(t, withKey(viewer), id); op.State != "STATE_UNKNOWN" || !op.NeedsReview {
			t.Errorf("after the refused calls: %+v", op)
		}
		// A bad usage does not print the key either.
		check(fails(t, withKey(rec), 2, []string{"usage:"}, "lookup", "--api-key", rec))
		check(fails(t, withKey(rec), 2, []string{"usage:", "<redacted>"}, rec, "lookup", "x"))
		check(fails(t, addr, 2, []string{"usage:"}, "--api-key", rec, "lookup", "x", rec))
		check(fails(t, addr, 2, []string{"usage:", "<redacted>"}, "lookup", "x", "--timeout", rec, "--api-key", rec))

		for _, o := range outs {
			for _, k := range []string{rec, agent, viewer, wrong} {
				secret := strings.SplitN(k, ".", 2)[1]
				if strings.Contains(o.stdout+o.stderr, secret) {
					t.Fatalf("the key is printed: %s", o)
				}
			}
		}
	})
}

// TestTLS: --tls-ca and LEDGER_TLS_CA, and a client certificate (mTLS).
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	pki := newPKI(t, dir)
	keys := newKeyring(t, "reconciler")
	creds := keys.creds(t, "clients:\n  - {common_name: ops-cli, tenant: "+keys.tenant+", scopes: [viewer]}\n")
	l, err := ledger.New(redistest.Shared(t).Client(t), ledger.Options{Policies: ledger.DefaultPolicies(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(server.Config{Ledger: l, Auth: server.NewAuthenticator(creds), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pki.server}, ClientCAs: pki.pool,
			ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12})))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		svc.Shutdown(ctx)
	})
	addr := lis.Addr().String()
	key := map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": keys.keys["reconciler"]}

	must(t, key, "list-unresolved", "--tls-ca", pki.caFile)
	must(t, key, "--tls", "--tls-ca", pki.caFile, "list-unresolved")
	envCA := map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": keys.keys["reconciler"], "LEDGER_TLS_CA": pki.caFile}
	must(t, envCA, "list-unresolved")
	// mTLS: the certificate alone is the credential (mapped to viewer).
	must(t, map[string]string{"LEDGER_ADDR": addr}, "list-unresolved", "--tls-ca", pki.caFile, "--tls-cert", pki.clientCert, "--tls-key", pki.clientKey)
	fails(t, map[string]string{"LEDGER_ADDR": addr}, 1, []string{"PERMISSION_DENIED", "reconciler scope"},
		"reconcile", "x", "escalate", "--tls-ca", pki.caFile, "--tls-cert", pki.clientCert, "--tls-key", pki.clientKey)
	// The system's roots do not know the test CA; plaintext is not TLS.
	fails(t, key, 1, []string{"ledgerctl: UNAVAILABLE: ", "--tls-ca"}, "--tls", "list-unresolved")
	fails(t, key, 1, []string{"ledgerctl: UNAVAILABLE: "}, "list-unresolved")
	// Bad TLS files.
	fails(t, key, 1, []string{"ledgerctl: TLS_CONFIG: --tls-ca"}, "list-unresolved", "--tls-ca", filepath.Join(dir, "missing.pem"))
	fails(t, key, 1, []string{"ledgerctl: TLS_CONFIG: --tls-ca", "no PEM certificate"}, "list-unresolved", "--tls-ca", pki.notPEM)
	fails(t, key, 2, []string{"--tls-cert and --tls-key go together"}, "list-unresolved", "--tls-cert", pki.clientCert)
}

type testPKI struct {
	pool                          *x509.CertPool
	server                        tls.Certificate
	caFile, clientCert, clientKey string
	notPEM                        string // a file that holds no PEM block
}

// newPKI makes a CA, a server certificate for 127.0.0.1 and a client
// certificate "ops-cli", and writes the CA's and the client's files to dir.
func newPKI(t *testing.T, dir string) *testPKI {
	t.Helper()
	ca := ledgertest.NewPKI(t, dir)
	p := &testPKI{pool: ca.Pool, caFile: ca.CAFile}
	p.server, _, _ = ca.Issue(t, "ledger", "ledger", true)
	_, p.clientCert, p.clientKey = ca.Issue(t, "client", "ops-cli", false)
	p.notPEM = ca.NotPEM
	return p
}

// TestWithoutAuth: a ledger without credentials (every caller is the
// tenant "default"), on the embedded engine; and no ledger at all.
func TestWithoutAuth(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		// This is the only test of the binary in the shared server's
		// "default" tenant; it leaves nothing unresolved there.
		st := servicetest.Start(t, rdb, servicetest.Options{})
		sdk, err := client.Dial(st.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer sdk.Close()
		id := "wf-1:refund " + client.NewHolder() // an id with a space
		r, err := sdk.Reserve(context.Background(), client.Op{ID: id, Tool: "payments.refund"}, client.NewHolder())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sdk.MarkUnknown(context.Background(), id, r.Operation.FencingToken, "timeout"); err != nil {
			t.Fatal(err)
		}
		env := map[string]string{"LEDGER_ADDR": st.Addr}
		ids, _ := listIDs(t, env)
		if !slices.Equal(ids, []string{id}) {
			t.Errorf("list-unresolved = %q", ids)
		}
		o := must(t, env, "lookup", "--", id)
		if !strings.Contains(o.stdout, "operation          "+id+"\n") || !strings.Contains(o.stdout, "anonymous") {
			t.Errorf("lookup:\n%s", o.stdout)
		}
		must(t, env, "reconcile", id, "abandon")
		if ids, _ := listIDs(t, env); len(ids) != 0 {
			t.Errorf("list-unresolved after abandon = %q", ids)
		}
		fails(t, env, 1, []string{"ledgerctl: UNAVAILABLE: ", "the server at " + st.Addr + " does not serve TLS: leave out --tls"}, "--tls", "lookup", "x")
	})

	// An HTTP/1.1 server, such as ledgerd's HTTP/JSON API.
	web := httptest.NewServer(http.NotFoundHandler())
	defer web.Close()
	webAddr := web.Listener.Addr().String()
	fails(t, nil, 1, []string{"ledgerctl: UNAVAILABLE: ", "the server at " + webAddr + " answers HTTP/1.1, not gRPC"}, "--addr", webAddr, "lookup", "x")

	// Nobody listens on a port just closed.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	o := fails(t, nil, 1, []string{"ledgerctl: UNAVAILABLE: ", "cannot reach the ledger at " + addr}, "--addr", addr, "lookup", "x")
	if strings.Count(o.stderr, "\n") != 1 {
		t.Errorf("want one line: %s", o)
	}
}

// TestUsage: bad command lines exit 2 with the usage, and change nothing.
func TestUsage(t *testing.T) {
	// Nothing listens here: a command that got past the usage check would
	// exit 1, not 2.
	env := map[string]string{"LEDGER_ADDR": "127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--json"}, "no command"},
		{[]string{"lookup"}, "lookup needs an operation id"},
		{[]string{"lookup", "a", "b"}, "one operation id"},
		{[]string{"lookup", "a", "--state", "pending"}, "--state is not a flag of lookup"},
		{[]string{"lookup", "a", "--bogus"}, "flag provided but not defined: --bogus"},
		{[]string{"lookup", "a", "--timeout"}, "flag needs an argument"},
		{[]string{"lookup", "a", "--timeout", "soon"}, "invalid value"},
		{[]string{"lookup", "a", "--timeout", "0s"}, "--timeout must be positive"},
		{[]string{"lookup", "a", "--addr", ""}, "--addr is empty"},
		// An empty TLS file (an unset variable) would mean plaintext.
		{[]string{"lookup", "a", "--tls-ca", ""}, "--tls-ca is empty"},
		{[]string{"lookup", "a", "--tls-ca="}, "--tls-ca is empty"},
		{[]string{"lookup", "a", "--tls-cert", "", "--tls-key", ""}, "--tls-cert is empty"},
		{[]string{"lookup", "a", "--tls", "--tls-cert", "c.pem", "--tls-key", ""}, "--tls-key is empty"},
		{[]string{"list-unresolved", "x"}, "takes no arguments"},
		{[]string{"list-unresolved", "--state", "done"}, `"done" is not pending, running or unknown`},
		{[]string{"list-unresolved", "--limit", "0"}, "--limit must be positive"},
		{[]string{"list-unresolved", "--overdue", "--state", "pending"}, "--overdue selects UNKNOWN operations"},
		{[]string{"list-unresolved", "--needs-review", "--state", "running"}, "--needs-review selects UNKNOWN operations"},
		{[]string{"list-unresolved", "--note", "x"}, "--note is not a flag of list-unresolved"},
		{[]string{"reconcile"}, "needs an operation id and a finding"},
		{[]string{"reconcile", "a"}, "needs an operation id and a finding"},
		{[]string{"reconcile", "a", "applied", "b"}, "needs an operation id and a finding"},
		{[]string{"reconcile", "a", "maybe"}, `unknown finding "maybe"`},
		{[]string{"reconcile", "a", "not-applied", "--resource-id", "r"}, "--resource-id and --data go with the applied finding only"},
		{[]string{"reconcile", "a", "escalate", "--data", "{}"}, "--resource-id and --data go with the applied finding only"},
		{[]string{"reconcile", "a", "applied", "--failure-code", "X"}, "--failure-code and --failure-message go with the abandon finding only"},
		{[]string{"reconcile", "a", "applied", "--data", "not json"}, "--data: not a JSON object"},
		{[]string{"reconcile", "a", "applied", "--data", "[1]"}, "--data: not a JSON object ({...}): an array"},
		{[]string{"reconcile", "a", "applied", "--data", "null"}, "--data: not a JSON object ({...}): null"},
		{[]string{"reconcile", "a", "applied", "--data", `"s3cr3t"`}, "--data: not a JSON object ({...}): a string"},
		{[]string{"reconcile", "a", "applied", "--data", `{"a":1} {"b":2}`}, "--data: more than one JSON value"},
		{[]string{"reconcile", "a", "applied", "--tool", "t"}, "--tool is not a flag of reconcile"},
		// A fencing token is the decimal number lookup shows; 0 would mean
		// "whichever attempt is current", the opposite of what it asks.
		{[]string{"reconcile", "a", "not-applied", "--fencing-token", "0"}, "--fencing-token"},
		{[]string{"reconcile", "a", "not-applied", "--fencing-token", "0x1a2b"}, "--fencing-token"},
		{[]string{"reconcile", "a", "not-applied", "--fencing-token", "017"}, "--fencing-token"},
		{[]string{"reconcile", "a", "not-applied", "--fencing-token", "1_796_001_016_347"}, "--fencing-token"},
		{[]string{"reconcile", "a", "not-applied", "--fencing-token", "-1"}, "--fencing-token"},
		{[]string{"reconcile", "a", "not-applied", "--fencing-token", "18446744073709551616"}, "--fencing-token"},
		// Text the wire cannot carry is refused here, not by gRPC as INTERNAL.
		{[]string{"lookup", "a\xff"}, `argument "a\xff" is not UTF-8 text`},
		{[]string{"get-run", "\xfe"}, `argument "\xfe" is not UTF-8 text`},
		{[]string{"list-unresolved", "--tool", "t\xff"}, "--tool is not UTF-8 text"},
		{[]string{"reconcile", "a", "escalate", "--note", "n\xff"}, "--note is not UTF-8 text"},
		{[]string{"end-run", "r", "done", "--reason", "\xff"}, "--reason is not UTF-8 text"},
		{[]string{"lookup", "a", "--api-key", "k.s\x01"}, "the API key (--api-key, or LEDGER_API_KEY) has bytes no API key has"},
		{[]string{"lookup", "a", "--api-key", "k.s\xc3\xa9"}, "the API key (--api-key, or LEDGER_API_KEY) has bytes no API key has"},
	} {
		o := ctl(t, env, c.args...)
		if o.code != 2 || !strings.HasPrefix(o.stderr, "ledgerctl: ") || !strings.Contains(strings.SplitN(o.stderr, "\n", 2)[0], c.want) || !strings.Contains(o.stderr, "usage: ledgerctl") || o.stdout != "" {
			t.Errorf("ledgerctl %q: want exit 2 with %q and the usage: %s", c.args, c.want, o)
		}
	}
	// Help goes to stdout and exits 0.
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"help", "reconcile"}, {"reconcile", "--help"}, {"list-unresolved", "-h"}} {
		o := ctl(t, env, args...)
		if o.code != 0 || !strings.HasPrefix(o.stdout, "usage: ledgerctl") || o.stderr != "" {
			t.Errorf("ledgerctl %q: %s", args, o)
		}
	}
	if o := ctl(t, env, "help"); !strings.Contains(o.stdout, "list-unresolved") || !strings.Contains(o.stdout, "--api-key") {
		t.Errorf("help: %s", o)
	}
	if o := ctl(t, env, "help", "reconcile"); !strings.Contains(o.stdout, "not-applied") || strings.Contains(o.stdout, "--needs-review") {
		t.Errorf("help reconcile: %s", o)
	}
}

// TestSplit: flags anywhere, "--" ends them.
func TestSplit(t *testing.T) {
	o, err := parse([]string{"--json", "reconcile", "--note", "--", "id", "--addr=h:1", "applied", "--tls", "--resource-id", "r"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if o.cmd != "reconcile" || !slices.Equal(o.args, []string{"id", "applied"}) || o.note != "--" || o.addr != "h:1" || !o.tls || !o.json || o.resourceID != "r" {
		t.Errorf("parse: %+v", o)
	}
	o, err = parse([]string{"lookup", "--", "--weird-id"}, func(k string) string { return map[string]string{"LEDGER_ADDR": "e:1"}[k] })
	if err != nil || !slices.Equal(o.args, []string{"--weird-id"}) || o.addr != "e:1" || o.timeout != defaultTimeout {
		t.Errorf("parse = %+v, %v", o, err)
	}
}

// TestReconcileNoAnswer: a reconcile that got no answer (a timeout, a
// dropped connection) may have been recorded; the error says so, and that
// the same command again is the safe retry (not another finding or note).
func TestReconcileNoAnswer(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	env := e.env
	id := "wf-8:refund"
	e.markUnknown(t, id, "payments.refund", "timeout")
	want := []string{"may have been recorded", "run the same command again", "ledgerctl lookup " + id}
	fails(t, env, 1, append([]string{"ledgerctl: DEADLINE_EXCEEDED: "}, want...), "reconcile", id, "escalate", "--note", "n", "--timeout", "1ns")
	o := fails(t, env, 1, nil, "--json", "reconcile", id, "escalate", "--timeout", "1ns")
	var je jsonError
	if err := json.Unmarshal([]byte(o.stderr), &je); err != nil || je.Reason != "DEADLINE_EXCEEDED" || !strings.Contains(je.Hint, want[1]) {
		t.Errorf("--json = %v: %s", err, o)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	_ = lis.Close()
	fails(t, env, 1, append([]string{"ledgerctl: UNAVAILABLE: ", "cannot reach the ledger at " + closed}, want...), "reconcile", id, "escalate", "--addr", closed)
	// The same command again records it once.
	must(t, env, "reconcile", id, "escalate", "--note", "n")
	must(t, env, "reconcile", id, "escalate", "--note", "n")
	if op := lookupJSON(t, env, id); !op.NeedsReview || len(op.History) != 3 {
		t.Errorf("after the retries: %+v", op)
	}
	// Other commands change nothing: no such hint.
	if o := fails(t, env, 1, nil, "lookup", id, "--timeout", "1ns"); strings.Contains(o.stderr, "recorded") {
		t.Errorf("lookup: %s", o)
	}
}

// TestReconcileRepeat: the ledger takes a finding with the note of one the
// same key already recorded for the operation as a repeat of it, and
// changes nothing. When the operation has moved on since (another attempt
// ended UNKNOWN), ledgerctl says that this call recorded nothing, instead of
// printing the finding as done.
func TestReconcileRepeat(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	env := e.env
	id := "wf-10:refund"
	e.markUnknown(t, id, "payments.refund", "timeout")
	o := must(t, env, "reconcile", id, "not-applied", "--note", "INC-7")
	if strings.Contains(o.stderr, "recorded nothing") {
		t.Errorf("a new finding: %s", o)
	}
	// The retry after a timeout: the same answer, nothing to say.
	if o = must(t, env, "reconcile", id, "not-applied", "--note", "INC-7"); o.stderr != "" {
		t.Errorf("a repeat of the latest finding: %s", o)
	}
	// Attempt 2 runs and ends UNKNOWN; the same command again cannot say
	// whether it repeats the finding about attempt 1 or is one about
	// attempt 2: refused, recording nothing, and saying what to give.
	e.markUnknown(t, id, "payments.refund", "timeout again")
	fails(t, env, 1, []string{"ledgerctl: STALE_FENCING_TOKEN: ", "about an earlier attempt", "--fencing-token", "new --note"},
		"reconcile", id, "not-applied", "--note", "INC-7")
	if op := lookupJSON(t, env, id); op.State != "STATE_UNKNOWN" || op.Attempt != 2 {
		t.Errorf("after the refused repeat: %+v", op)
	}
	// With a new note it is a new finding, about attempt 2.
	o = must(t, env, "reconcile", id, "not-applied", "--note", "INC-7, attempt 2")
	if strings.Contains(o.stderr, "recorded nothing") || !strings.Contains(o.stdout, "not-applied → PENDING") {
		t.Errorf("a new note: %s", o)
	}
}

// TestReconcileResolvedOtherwise: applied on an operation already SUCCEEDED
// (abandon on one already FAILED_FINAL) changes nothing. With the result
// (failure) that stands the ledger answers OK; with another one, none given
// included, it answers ALREADY_RESOLVED (a ledger older than that answered
// OK). Another result than the one given may be a second effect: ledgerctl
// says that this call recorded nothing and prints the record that stands,
// instead of a plain "reconciled" or a bare refusal.
func TestReconcileResolvedOtherwise(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	env, ctx := e.env, context.Background()
	done, failed := "wf-11:refund", "wf-12:refund"
	tok := e.reserve(t, done, "payments.refund")
	if _, err := e.sdk.Complete(ctx, done, tok, client.Result{ResourceID: "re_A", Data: map[string]any{"amount": 1250}}); err != nil {
		t.Fatal(err)
	}
	tok = e.reserve(t, failed, "payments.refund")
	if _, err := e.sdk.Fail(ctx, failed, tok, true, client.Failure{Code: "CARD_DECLINED", Message: "declined"}); err != nil {
		t.Fatal(err)
	}
	// The same result or failure: nothing to say.
	for _, args := range [][]string{
		{"reconcile", done, "applied", "--resource-id", "re_A", "--data", `{"amount": 1250}`},
		{"reconcile", failed, "abandon", "--failure-code", "CARD_DECLINED", "--failure-message", "declined"},
	} {
		if o := must(t, env, args...); o.stderr != "" || !strings.HasPrefix(o.stdout, "reconciled ") {
			t.Errorf("ledgerctl %q: %s", args, o)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"reconcile", done, "applied", "--resource-id", "re_B"}, "re_A"},
		{[]string{"reconcile", done, "applied", "--resource-id", "re_A", "--data", `{"amount": 1300}`}, `{"amount":1250}`},
		{[]string{"reconcile", done, "applied", "--resource-id", "re_A"}, `{"amount":1250}`},
		{[]string{"reconcile", done, "applied"}, "re_A"},
		{[]string{"reconcile", failed, "abandon", "--failure-code", "REFUNDED_BY_HAND"}, "CARD_DECLINED: declined"},
		{[]string{"reconcile", failed, "abandon", "--failure-code", "CARD_DECLINED"}, "CARD_DECLINED: declined"},
		{[]string{"reconcile", failed, "abandon"}, "CARD_DECLINED: declined"},
	} {
		o := must(t, env, c.args...)
		if !strings.Contains(o.stderr, "this call recorded nothing") || !strings.Contains(o.stderr, c.want) ||
			!strings.HasPrefix(o.stdout, "not reconciled ") || !strings.Contains(o.stdout, "RESERVED") {
			t.Errorf("ledgerctl %q: %s", c.args, o)
		}
	}
	if op := lookupJSON(t, env, done); op.Result == nil || op.Result.ResourceID != "re_A" {
		t.Errorf("the result changed: %+v", op)
	}

	// A finding about attempt 1 (its token) on an operation a later attempt
	// resolved is answered OK too: it says so, with or without a result.
	later := "wf-13:refund"
	e.markUnknown(t, later, "payments.refund", "timeout")
	t1 := strconv.FormatUint(lookupJSON(t, env, later).FencingToken, 10)
	must(t, env, "reconcile", later, "not-applied", "--fencing-token", t1)
	tok = e.reserve(t, later, "payments.refund")
	if _, err := e.sdk.Complete(ctx, later, tok, client.Result{ResourceID: "re_2"}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"reconcile", later, "applied", "--fencing-token", t1},
		{"reconcile", later, "applied", "--fencing-token", t1, "--resource-id", "re_2"},
	} {
		o := must(t, env, args...)
		if !strings.Contains(o.stderr, "this call recorded nothing") || !strings.Contains(o.stderr, "attempt 2") || strings.HasPrefix(o.stdout, "reconciled ") {
			t.Errorf("ledgerctl %q: %s", args, o)
		}
	}
	// About attempt 2 itself: nothing to say.
	if o := must(t, env, "reconcile", later, "applied", "--fencing-token", strconv.FormatUint(tok, 10), "--resource-id", "re_2"); o.stderr != "" {
		t.Errorf("applied about the attempt that resolved it: %s", o)
	}
}

// TestLookalikeText: the ledger accepts spaces anywhere in an operation id
// (and in notes); an id with a leading or trailing space, or with a run of
// spaces, is printed quoted, so that two operations never print alike and an
// id cannot print as more columns of the table.
func TestLookalikeText(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	env := e.env
	plain, trailing, forged := "wf-1:refund", "wf-1:refund ", "wf-1:x  payments.refund  SUCCEEDED  1/5"
	quoted := strconv.Quote(trailing) // an id of its own, quotes included
	for _, id := range []string{plain, trailing, " " + plain, forged, quoted} {
		e.markUnknown(t, id, "payments.refund", "gateway  timeout ")
	}
	o := must(t, env, "list-unresolved")
	rows := strings.Split(strings.TrimRight(o.stdout, "\n"), "\n")[1:]
	want := []string{plain, strconv.Quote(trailing), strconv.Quote(" " + plain), strconv.Quote(forged), strconv.Quote(quoted)}
	if len(rows) != len(want) {
		t.Fatalf("list-unresolved:\n%s", o.stdout)
	}
	for i, row := range rows {
		if !strings.HasPrefix(row, want[i]+"  ") || strings.Count(row, "payments.refund") != strings.Count(want[i], "payments.refund")+1 {
			t.Errorf("row %d: want the id %s:\n%s", i, want[i], o.stdout)
		}
	}
	o = must(t, env, "lookup", trailing)
	if !strings.Contains(o.stdout, "operation          \"wf-1:refund \"\n") || !strings.Contains(o.stdout, `"gateway  timeout "`) {
		t.Errorf("lookup %q:\n%s", trailing, o.stdout)
	}
	o = must(t, env, "reconcile", trailing, "escalate")
	if !strings.HasPrefix(o.stdout, `reconciled "wf-1:refund ": escalate`) {
		t.Errorf("reconcile %q:\n%s", trailing, o.stdout)
	}
	if op := lookupJSON(t, env, plain); op.NeedsReview {
		t.Errorf("%q escalated instead of %q", plain, trailing)
	}
}

// TestDataNumbers: the ledger keeps a result's numbers as 64-bit floats;
// reconcile applied refuses a --data number that would be recorded as
// another one (a large id or amount in minor units), instead of recording it
// rounded for every retry to replay.
func TestDataNumbers(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	env := e.env
	id := "wf-7:charge"
	e.markUnknown(t, id, "payments.charge", "timeout")
	for _, data := range []string{
		`{"charge_id": 9007199254740993}`,
		`{"amounts": [1, {"minor": 12345678901234567891}]}`,
		`{"n": -9007199254740993}`,
		`{"n": 1e400}`,
		`{"n": 1e-400}`,
		`{"n": 1e-999999999}`,
		`{"n": 0.10000000000000000001}`,
	} {
		fails(t, env, 2, []string{"--data: ", "not exactly"}, "reconcile", id, "applied", "--data", data)
	}
	// Of two such numbers, the first by name, whatever the map's order.
	for range 10 {
		fails(t, env, 2, []string{"the number 9007199254740995 "}, "reconcile", id, "applied", "--data",
			`{"c": 9007199254740997, "a": 9007199254740995, "b": 9007199254740993}`)
	}
	if op := lookupJSON(t, env, id); op.State != "STATE_UNKNOWN" {
		t.Fatalf("a refused --data was recorded: %+v", op)
	}
	// Numbers a float holds exactly, or whose shortest form is the one
	// given, are recorded as given.
	must(t, env, "reconcile", id, "applied", "--data", `{"a": 9007199254740992, "b": 0.1, "c": -2.5e-3, "d": 1E2, "e": 0, "f": 0.0e-999999999, "g": [1.5], "h": 123456789012}`)
	op := lookupJSON(t, env, id)
	if op.State != "STATE_SUCCEEDED" || op.Result == nil {
		t.Fatalf("after applied: %+v", op)
	}
	b, _ := json.Marshal(op.Result.Data)
	if want := `{"a":9007199254740992,"b":0.1,"c":-0.0025,"d":100,"e":0,"f":0,"g":[1.5],"h":123456789012}`; string(b) != want {
		t.Errorf("data = %s, want %s", b, want)
	}
}

// TestClean: text from the ledger cannot drive the terminal.
func TestClean(t *testing.T) {
	for in, want := range map[string]string{
		"plain note":     "plain note",
		"ünïcödé ok":     "ünïcödé ok",
		"a\x1b[31mred":   `"a\x1b[31mred"`,
		"two\nlines":     `"two\nlines"`,
		"tab\there":      `"tab\there"`,
		"c1 \u009b here": `"c1 \u009b here"`,
		"one space":      "one space",
		"two  spaces":    `"two  spaces"`,
		" leading":       `" leading"`,
		"trailing ":      `"trailing "`,
		`"quoted"`:       `"\"quoted\""`,
		`say "hi"`:       `say "hi"`,
		"-":              `"-"`,
		"":               "",
	} {
		if got := clean(in); got != want {
			t.Errorf("clean(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestKeyNotSentInClear: the SDK refuses to send an API key without TLS
// beyond loopback; ledgerctl says to use TLS.
func TestKeyNotSentInClear(t *testing.T) {
	ip := ledgertest.NonLoopbackIPv4(t)
	keys := newKeyring(t, "reconciler")
	l, err := ledger.New(redistest.Shared(t).Client(t), ledger.Options{Policies: ledger.DefaultPolicies(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(server.Config{Ledger: l, Auth: server.NewAuthenticator(keys.creds(t, "")), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Skip("cannot listen on", ip, err)
	}
	go func() { _ = svc.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		svc.Shutdown(ctx)
	})
	key := keys.keys["reconciler"]
	o := fails(t, map[string]string{"LEDGER_API_KEY": key}, 1, []string{"ledgerctl: API_KEY_NOT_SENT: ", "refusing to send the API key", "add --tls"},
		"--addr", lis.Addr().String(), "lookup", "x")
	if strings.Contains(o.stdout+o.stderr, strings.SplitN(key, ".", 2)[1]) {
		t.Fatalf("the key is printed: %s", o)
	}
}

// jsonDoc is what one --json command prints on stdout: the operation's (or
// the list's) fields, with whether the call recorded its finding and the
// notices.
type jsonDoc struct {
	jsonOperation
	Recorded   *bool           `json:"recorded"`
	Notices    []jsonNotice    `json:"notices"`
	Operations []jsonOperation `json:"operations"`
}

// ctlJSON runs ledgerctl --json, which must exit 0 with one JSON document
// on stdout and nothing on stderr, and decodes the document.
func ctlJSON(t *testing.T, env map[string]string, args ...string) jsonDoc {
	t.Helper()
	o := must(t, env, append([]string{"--json"}, args...)...)
	if o.stderr != "" {
		t.Errorf("ledgerctl --json %q wrote to stderr: %s", args, o)
	}
	dec := json.NewDecoder(strings.NewReader(o.stdout))
	var d jsonDoc
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("ledgerctl --json %q: %v: %s", args, err, o)
	}
	if dec.More() {
		t.Fatalf("ledgerctl --json %q: more than one JSON document: %s", args, o)
	}
	if !strings.Contains(o.stdout, `"notices": [`) {
		t.Fatalf("ledgerctl --json %q: no notices array: %s", args, o)
	}
	return d
}

// codes returns the notices' codes.
func (d jsonDoc) codes() []string {
	var c []string
	for _, n := range d.Notices {
		c = append(c, n.Code)
	}
	return c
}

// TestJSONNotices: with --json, what ledgerctl says besides the record (this
// call recorded nothing, and why) is in the JSON document on stdout, with a
// code, instead of plain text on stderr that a script never parses.
func TestJSONNotices(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	env, ctx := e.env, context.Background()

	// A new finding: recorded, nothing to say.
	repeat := "wf-20:refund"
	tok1 := e.reserve(t, repeat, "expiring.refund")
	time.Sleep(250 * time.Millisecond) // the lease (200ms) ends without a report
	if d := ctlJSON(t, env, "reconcile", repeat, "not-applied", "--note", "INC-9"); d.Recorded == nil || !*d.Recorded || len(d.Notices) != 0 {
		t.Errorf("a new finding: recorded %v, notices %+v", d.Recorded, d.Notices)
	}
	// The attempt's worker reports UNKNOWN after the finding; the same
	// command is a repeat of the finding about this attempt.
	if _, err := e.sdk.MarkUnknown(ctx, repeat, tok1, "the refund may have landed after all"); err != nil {
		t.Fatal(err)
	}
	d := ctlJSON(t, env, "reconcile", repeat, "not-applied", "--note", "INC-9")
	if d.Recorded == nil || *d.Recorded || !slices.Equal(d.codes(), []string{"NOTHING_RECORDED_REPEAT"}) ||
		!strings.Contains(d.Notices[0].Message, "this call recorded nothing") || d.State != "STATE_UNKNOWN" {
		t.Errorf("a repeat: recorded %v, notices %+v, state %s", d.Recorded, d.Notices, d.State)
	}

	// Applied with another result on a SUCCEEDED operation.
	done := "wf-21:refund"
	tok := e.reserve(t, done, "payments.refund")
	if _, err := e.sdk.Complete(ctx, done, tok, client.Result{ResourceID: "re_A"}); err != nil {
		t.Fatal(err)
	}
	d = ctlJSON(t, env, "reconcile", done, "applied", "--resource-id", "re_B")
	if d.Recorded == nil || *d.Recorded || !slices.Equal(d.codes(), []string{"NOTHING_RECORDED_OTHER_RESULT"}) || !strings.Contains(d.Notices[0].Message, "re_A") {
		t.Errorf("another result: recorded %v, notices %+v", d.Recorded, d.Notices)
	}
	// Abandon with another failure on a FAILED_FINAL one.
	failed := "wf-22:refund"
	tok = e.reserve(t, failed, "payments.refund")
	if _, err := e.sdk.Fail(ctx, failed, tok, true, client.Failure{Code: "CARD_DECLINED"}); err != nil {
		t.Fatal(err)
	}
	d = ctlJSON(t, env, "reconcile", failed, "abandon", "--failure-code", "REFUNDED_BY_HAND")
	if d.Recorded == nil || *d.Recorded || !slices.Equal(d.codes(), []string{"NOTHING_RECORDED_OTHER_FAILURE"}) {
		t.Errorf("another failure: recorded %v, notices %+v", d.Recorded, d.Notices)
	}
	// A finding with the token of attempt 1 on an operation attempt 2
	// resolved.
	later := "wf-23:refund"
	e.markUnknown(t, later, "payments.refund", "timeout")
	t1 := strconv.FormatUint(lookupJSON(t, env, later).FencingToken, 10)
	must(t, env, "reconcile", later, "not-applied", "--fencing-token", t1)
	tok = e.reserve(t, later, "payments.refund")
	if _, err := e.sdk.Complete(ctx, later, tok, client.Result{ResourceID: "re_2"}); err != nil {
		t.Fatal(err)
	}
	d = ctlJSON(t, env, "reconcile", later, "applied", "--fencing-token", t1)
	if d.Recorded == nil || *d.Recorded || !slices.Equal(d.codes(), []string{"NOTHING_RECORDED_OTHER_ATTEMPT"}) || !strings.Contains(d.Notices[0].Message, "attempt 2") {
		t.Errorf("another attempt: recorded %v, notices %+v", d.Recorded, d.Notices)
	}
	// The same cases without --json: plain text on stderr, as before.
	if o := must(t, env, "reconcile", done, "applied", "--resource-id", "re_B"); !strings.HasPrefix(o.stderr, "ledgerctl: this call recorded nothing") ||
		strings.Contains(o.stdout, "NOTHING_RECORDED") {
		t.Errorf("without --json: %s", o)
	}

	// lookup and list-unresolved carry the array too; a list cut by
	// --limit says so.
	e.markUnknown(t, "wf-24:refund", "payments.refund", "timeout")
	if d := ctlJSON(t, env, "lookup", done); len(d.Notices) != 0 || d.Recorded != nil {
		t.Errorf("lookup: recorded %v, notices %+v", d.Recorded, d.Notices)
	}
	if d := ctlJSON(t, env, "list-unresolved", "--limit", "1"); len(d.Operations) != 1 || !slices.Equal(d.codes(), []string{"MORE_REMAIN"}) {
		t.Errorf("list-unresolved --limit 1: %d operations, notices %+v", len(d.Operations), d.Notices)
	}
}

// TestHistoryCut: the ledger keeps the latest 50 transitions of an
// operation. When the creation is no longer among them, lookup says that
// earlier transitions are not kept, with how many at least (from the
// attempt numbers), in text and in JSON; a whole history says nothing.
func TestHistoryCut(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	env, ctx := e.env, context.Background()
	whole, cut := "wf-30:sync", "wf-31:sync"
	// cycles retryable failures, each followed by a claim: 2 transitions
	// each after the creation.
	churn := func(id string, cycles int) uint64 {
		tok := e.reserve(t, id, "retried.sync")
		for range cycles {
			if _, err := e.sdk.Fail(ctx, id, tok, false, client.Failure{Code: "BUSY"}); err != nil {
				t.Fatal(err)
			}
			r, err := e.sdk.Reserve(ctx, client.Op{ID: id, Tool: "retried.sync", PermitID: "approval-1", RunID: "run-1", Step: 2,
				Params: map[string]any{"amount": 1250}}, client.NewHolder())
			if err != nil || r.Decision != client.DecisionExecute {
				t.Fatalf("Reserve %s = %+v, %v", id, r, err)
			}
			tok = r.Operation.FencingToken
		}
		return tok
	}
	churn(whole, 24) // 49 transitions: all kept
	churn(cut, 30)   // 61: the first 11 dropped, up to attempt 6's failure
	// 62, ending with a failure: the first 12 dropped, so the first kept
	// entry is attempt 7's claim; the claims of attempts 1 to 6 are
	// certainly gone.
	claimFirst := "wf-32:sync"
	if _, err := e.sdk.Fail(ctx, claimFirst, churn(claimFirst, 30), false, client.Failure{Code: "BUSY"}); err != nil {
		t.Fatal(err)
	}
	if op := lookupJSON(t, env, claimFirst); len(op.History) != 50 || op.History[0].ToState != "STATE_RUNNING" || op.History[0].Attempt != 7 ||
		op.HistoryNotKept == nil || *op.HistoryNotKept != 6 {
		t.Errorf("a cut history from a claim, --json: %d entries from %+v, not kept %v", len(op.History), op.History[0], op.HistoryNotKept)
	}

	o := must(t, env, "lookup", whole)
	if strings.Contains(o.stdout, "not kept") || !strings.Contains(o.stdout, "- → RUNNING") {
		t.Errorf("a whole history: %s", o)
	}
	if o := must(t, env, "lookup", "--json", whole); !strings.Contains(o.stdout, `"history_truncated": false,`) ||
		!strings.Contains(o.stdout, `"history_not_kept_at_least": 0`) {
		t.Errorf("a whole history, --json: %s", o)
	}
	if op := lookupJSON(t, env, whole); len(op.History) != 49 || op.HistoryTruncated == nil || *op.HistoryTruncated || op.HistoryNotKept == nil || *op.HistoryNotKept != 0 {
		t.Errorf("a whole history, --json: %d entries, truncated %v, not kept %v", len(op.History), op.HistoryTruncated, op.HistoryNotKept)
	}

	o = must(t, env, "lookup", cut)
	lines := strings.Split(o.stdout, "\n")
	i := slices.Index(lines, "history (oldest first):")
	if i < 0 || i+2 >= len(lines) || lines[i+1] != "… at least 6 earlier transitions not kept (the ledger keeps the latest 50)" ||
		!strings.HasPrefix(lines[i+2], "TIME") || strings.Contains(o.stdout, "- → RUNNING") {
		t.Errorf("a cut history: %s", o)
	}
	op := lookupJSON(t, env, cut)
	if len(op.History) != 50 || op.History[0].FromState == "STATE_UNSPECIFIED" || op.History[0].Attempt != 6 ||
		op.HistoryTruncated == nil || !*op.HistoryTruncated || op.HistoryNotKept == nil || *op.HistoryNotKept != 6 {
		t.Errorf("a cut history, --json: %d entries from %+v, truncated %v, not kept %v", len(op.History), op.History[0], op.HistoryTruncated, op.HistoryNotKept)
	}
	if historyLimit != ledger.HistoryLimit {
		t.Errorf("historyLimit %d, the ledger keeps %d", historyLimit, ledger.HistoryLimit)
	}
	// list-unresolved has no history, so no such fields.
	if o := must(t, env, "list-unresolved", "--json"); strings.Contains(o.stdout, "history_") {
		t.Errorf("list-unresolved: %s", o)
	}
}

// TestClockBehind: when this machine's clock is behind the store's, the
// store's times are in this machine's future. Ages and "ago" are then not
// negative: they are reckoned from the latest store time in the answer (a
// time the store's clock has passed), marked as lower bounds, and a notice
// says the clock is behind (in the JSON document with --json).
func TestClockBehind(t *testing.T) {
	rdb := redistest.Shared(t).Client(t)
	e := newLedgerEnv(t, rdb)
	env := e.env
	old, young := "wf-40:charge", "wf-41:refund"
	e.markUnknown(t, old, "overdue.charge", "read timeout")
	e.markUnknown(t, young, "payments.refund", "timeout")
	// The store has old overdue before any listing by the ledger's
	// selection below.
	e.waitOverdue(t, rdb, old)

	defer func(c func() time.Time) { clock = c }(clock)
	clock = func() time.Time { return time.Now().Add(-time.Hour) }

	o := must(t, env, "list-unresolved")
	rows := strings.Split(strings.TrimRight(o.stdout, "\n"), "\n")
	if len(rows) != 3 || !strings.Contains(rows[0], "AGE") {
		t.Fatalf("list-unresolved: %s", o)
	}
	for _, row := range rows[1:] {
		if age := strings.Fields(row)[4]; !strings.HasPrefix(age, "≥") || strings.Contains(age, "-") {
			t.Errorf("AGE %q: %s", age, o)
		}
	}
	if !strings.Contains(o.stderr, "this machine's clock is behind the store's by at least 59m") {
		t.Errorf("list-unresolved says nothing of the clock: %s", o)
	}

	o = must(t, env, "lookup", young)
	if strings.Contains(o.stdout, "(in ") && !strings.Contains(o.stdout, "(in ≤") || strings.Contains(o.stdout, "ms ago)") && !strings.Contains(o.stdout, "(≥") ||
		!strings.Contains(o.stdout, "created            ") || !strings.Contains(o.stderr, "clock is behind") {
		t.Errorf("lookup: %s", o)
	}
	for _, line := range strings.Split(o.stdout, "\n") {
		if strings.HasPrefix(line, "created") || strings.HasPrefix(line, "updated") || strings.HasPrefix(line, "unknown since") {
			if !strings.HasSuffix(line, " ago)") || !strings.Contains(line, "(≥") {
				t.Errorf("lookup: %q is not a lower bound of the time since: %s", line, o)
			}
		}
	}

	for _, args := range [][]string{{"lookup", young}, {"list-unresolved"}, {"list-unresolved", "--overdue"}} {
		if d := ctlJSON(t, env, args...); !slices.Equal(d.codes(), []string{"CLOCK_BEHIND"}) {
			t.Errorf("ledgerctl --json %q: notices %+v", args, d.Notices)
		}
	}
	// --overdue is the ledger's selection, by the store's clock: the
	// operation the store has overdue is listed although its deadline is in
	// this machine's future, and the notice says whose selection it is.
	o = must(t, env, "list-unresolved", "--overdue")
	if !strings.Contains(o.stdout, old) || strings.Contains(o.stdout, young) ||
		!strings.Contains(o.stderr, "clock is behind") || !strings.Contains(o.stderr, "--overdue lists what the ledger selected by the store's clock") {
		t.Errorf("ledgerctl list-unresolved --overdue: %s", o)
	}
	// The store has nothing overdue for this tool: nothing is listed.
	if o := must(t, env, "list-unresolved", "--overdue", "--tool", "payments.refund"); o.stdout != "" || !strings.Contains(o.stderr, "no unresolved operations match") {
		t.Errorf("ledgerctl list-unresolved --overdue --tool payments.refund: %s", o)
	}
}

// TestEmptyValues: a flag given an empty value (an unset shell variable,
// "--resource-id $RID") is bad usage, not the flag left out: a reconcile
// would record a result without the resource id the operator meant (and
// every retry of the agent would replay it), a finding without its
// ticket, or a list of every tool instead of one.
func TestEmptyValues(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	env := e.env
	id := "wf-50:refund"
	e.markUnknown(t, id, "payments.refund", "timeout")
	for _, args := range [][]string{
		{"reconcile", id, "applied", "--resource-id", ""},
		{"reconcile", id, "applied", "--resource-id="},
		{"reconcile", id, "applied", "--resource-id", "re_1", "--data", ""},
		{"reconcile", id, "abandon", "--failure-code", ""},
		{"reconcile", id, "abandon", "--failure-code", "X", "--failure-message", ""},
		{"reconcile", id, "escalate", "--note", ""},
		{"list-unresolved", "--tool", ""},
	} {
		flag := ""
		for _, a := range args {
			if strings.HasPrefix(a, "--") {
				flag = strings.TrimSuffix(a, "=")
			}
		}
		fails(t, env, 2, []string{"ledgerctl: " + flag + " is empty", "usage: ledgerctl"}, args...)
	}
	// Nothing was recorded.
	if op := lookupJSON(t, env, id); op.State != "STATE_UNKNOWN" || op.NeedsReview || len(op.History) != 2 {
		t.Errorf("after the refused calls: %+v", op)
	}
}

// TestNotFoundOtherTenant: an operation of another tenant is NOT_FOUND to
// these credentials; the error says that it may be so, rather than read as
// "this operation does not exist".
func TestNotFoundOtherTenant(t *testing.T) {
	rdb := redistest.Shared(t).Client(t)
	a, b := newLedgerEnv(t, rdb), newLedgerEnv(t, rdb)
	id := "wf-60:refund"
	a.markUnknown(t, id, "payments.refund", "timeout")
	must(t, a.env, "lookup", id)
	want := "only the tenant of its credentials"
	fails(t, b.env, 1, []string{"ledgerctl: NOT_FOUND: no such operation; ", want}, "lookup", id)
	o := fails(t, b.env, 1, nil, "--json", "reconcile", id, "abandon")
	var je jsonError
	if err := json.Unmarshal([]byte(o.stderr), &je); err != nil || je.Reason != "NOT_FOUND" || !strings.Contains(je.Hint, want) {
		t.Errorf("--json = %v: %s", err, o)
	}
	// Not abandoned in tenant a.
	if op := lookupJSON(t, a.env, id); op.State != "STATE_UNKNOWN" {
		t.Errorf("after the other tenant's calls: %+v", op)
	}
}

// TestDataDuplicateKeys: --data with a key twice in one object, at any
// depth, is bad usage, and nothing is recorded: decoding would keep the
// last value silently, so the result recorded (and replayed to every
// retry) might not be the one the operator meant. The same key in
// different objects is fine.
func TestDataDuplicateKeys(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	env := e.env
	id := "wf-60:charge"
	e.markUnknown(t, id, "payments.charge", "timeout")
	for data, key := range map[string]string{
		`{"a":1,"a":2}`:                                `"a"`,
		`{"a":1,"b":{"c":[1,2],"c":[1,2]}}`:            `"c"`,
		`{"x":[{"a":1},{"b":{"k":1},"b":{"k":1}}]}`:    `"b"`,
		`{"a":1,"\u0061":2}`:                           `"a"`,
		`{"deep":[[[{"n":null,"m":true,"n":false}]]]}`: `"n"`,
	} {
		fails(t, env, 2, []string{"ledgerctl: --data: ", "duplicate key " + key, "usage: ledgerctl"}, "reconcile", id, "applied", "--data", data)
	}
	if op := lookupJSON(t, env, id); op.State != "STATE_UNKNOWN" || len(op.History) != 2 {
		t.Fatalf("a refused --data was recorded: %+v", op)
	}
	must(t, env, "reconcile", id, "applied", "--data", `{"a":{"a":1,"b":[{"a":1},{"a":2,"b":3}]},"b":[],"c":{}}`)
	op := lookupJSON(t, env, id)
	b, _ := json.Marshal(op.Result.Data)
	if want := `{"a":{"a":1,"b":[{"a":1},{"a":2,"b":3}]},"b":[],"c":{}}`; op.State != "STATE_SUCCEEDED" || string(b) != want {
		t.Fatalf("after applied: %s %s, want %s", op.State, b, want)
	}
}

// TestHelpUnknownCommand: help about a command that does not exist is bad
// usage (exit 2) naming it, with the usage that lists the commands, not
// the whole usage on stdout with exit 0 as if it had been answered.
func TestHelpUnknownCommand(t *testing.T) {
	env := map[string]string{"LEDGER_ADDR": "127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"help", "lookups"}, `unknown command "lookups"`},
		{[]string{"--json", "help", ""}, `unknown command ""`},
		{[]string{"help", "lookup", "reconcile"}, "help takes one command"},
		{[]string{"frobnicate", "-h"}, `unknown command "frobnicate"`},
		{[]string{"--help", "lookups"}, `unknown command "lookups"`},
	} {
		o := ctl(t, env, c.args...)
		if o.code != 2 || o.stdout != "" || !strings.HasPrefix(o.stderr, "ledgerctl: "+c.want) {
			t.Errorf("ledgerctl %q: want exit 2 with %q: %s", c.args, c.want, o)
			continue
		}
		for _, cmd := range allCommands() {
			if !strings.Contains(o.stderr, "\n  "+cmd) {
				t.Errorf("ledgerctl %q: the commands listed lack %s: %s", c.args, cmd, o)
			}
		}
	}
	for _, args := range [][]string{{"help", "help"}, {"help", "list-unresolved"}} {
		if o := ctl(t, env, args...); o.code != 0 || !strings.HasPrefix(o.stdout, "usage: ledgerctl") || o.stderr != "" {
			t.Errorf("ledgerctl %q: %s", args, o)
		}
	}
}

// TestLocalErrorsExit1: a call ledgerctl could not make (a TLS file it
// cannot read, an address it cannot parse) exits 1 with its own reason,
// as a call the ledger refused or that found no ledger does, as the usage
// says; bad usage exits 2.
func TestLocalErrorsExit1(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"LEDGER_ADDR": "127.0.0.1:1"}
	fails(t, env, 1, []string{"ledgerctl: TLS_CONFIG: --tls-ca"}, "lookup", "x", "--tls-ca", filepath.Join(dir, "missing.pem"))
	fails(t, env, 1, []string{"ledgerctl: BAD_ADDRESS: --addr"}, "lookup", "x", "--addr", "%zz")
	fails(t, env, 1, []string{"ledgerctl: UNAVAILABLE: "}, "lookup", "x")
	o := fails(t, env, 1, nil, "--json", "lookup", "x", "--addr", "%zz")
	var je jsonError
	if err := json.Unmarshal([]byte(o.stderr), &je); err != nil || je.Reason != "BAD_ADDRESS" || je.Code != "" {
		t.Errorf("--json BAD_ADDRESS = %v: %s", err, o)
	}
	for _, args := range [][]string{{"lookup"}, {"help", "x"}, {"lookup", "x", "--tls-ca", ""}} {
		fails(t, env, 2, []string{"usage: ledgerctl"}, args...)
	}
	if u := usage(""); !strings.Contains(u, "1 the call failed") || !strings.Contains(u, "TLS_CONFIG") || !strings.Contains(u, "BAD_ADDRESS") {
		t.Errorf("the usage does not say what exit 1 covers:\n%s", u)
	}
}

// TestUnparseableAddrIsBadAddress: an --addr that is not HOST:PORT is
// BAD_ADDRESS, exit 1, as docs/ledgerctl.md says, whatever else is set (an
// API key, which is not sent anywhere then): not UNAVAILABLE, whose hint
// for reconcile says the finding may have been recorded, when nothing was
// sent.
func TestUnparseableAddrIsBadAddress(t *testing.T) {
	for _, addr := range []string{":::", "[::1", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:0", "localhost:x", "bad addr:1"} {
		for _, env := range []map[string]string{{}, {"LEDGER_API_KEY": "ops.secret"}} {
			o := fails(t, env, 1, []string{"ledgerctl: BAD_ADDRESS: --addr " + addr + ": "}, "reconcile", "x", "escalate", "--addr", addr)
			if strings.Contains(o.stderr, "may have been recorded") {
				t.Errorf("ledgerctl --addr %q reconcile: the hint says the finding may have been recorded: %s", addr, o)
			}
		}
	}
	// A gRPC target with a scheme is gRPC's to parse.
	fails(t, nil, 1, []string{"ledgerctl: UNAVAILABLE: "}, "lookup", "x", "--addr", "dns:///127.0.0.1:1", "--timeout", "2s")
}

// TestTLSConfigSaysWhatToGive: a TLS file ledgerctl cannot use is
// TLS_CONFIG, exit 1, with a hint that says what the flag takes (and that
// leaving it out is an answer too), on stderr and in --json's "hint".
func TestTLSConfigSaysWhatToGive(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	env := map[string]string{"LEDGER_ADDR": "127.0.0.1:1"}
	ca := []string{"the PEM certificate of the CA that issued the ledger's certificate", "leave it out"}
	cert := []string{"a PEM client certificate and its private key", "leave both out"}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want []string
	}{
		{env, []string{"lookup", "x", "--tls-ca", missing}, append([]string{"ledgerctl: TLS_CONFIG: --tls-ca: "}, ca...)},
		{env, []string{"lookup", "x", "--tls-ca", notPEM}, append([]string{"ledgerctl: TLS_CONFIG: --tls-ca ", "no PEM certificate"}, ca...)},
		{map[string]string{"LEDGER_ADDR": "127.0.0.1:1", "LEDGER_TLS_CA": missing}, []string{"lookup", "x"}, append([]string{"ledgerctl: TLS_CONFIG: "}, ca...)},
		{env, []string{"lookup", "x", "--tls-cert", missing, "--tls-key", missing}, append([]string{"ledgerctl: TLS_CONFIG: --tls-cert/--tls-key: "}, cert...)},
		{env, []string{"lookup", "x", "--tls-cert", notPEM, "--tls-key", notPEM}, append([]string{"ledgerctl: TLS_CONFIG: --tls-cert/--tls-key: "}, cert...)},
	} {
		fails(t, tc.env, 1, tc.want, tc.args...)
		o := fails(t, tc.env, 1, nil, append([]string{"--json"}, tc.args...)...)
		var je jsonError
		if err := json.Unmarshal([]byte(o.stderr), &je); err != nil || je.Reason != "TLS_CONFIG" || !strings.Contains(je.Hint, tc.want[len(tc.want)-2]) {
			t.Errorf("--json %q = %v: %s", tc.args, err, o)
		}
	}
}

// TestBadAddressSaysWhatIsWanted: a BAD_ADDRESS names where the address
// came from (--addr, or LEDGER_ADDR when the flag is left out) and says what
// to give instead: HOST:PORT, or a gRPC target with a scheme. A HOST alone
// (the usual slip) says its port is missing. With --json the hint is the
// object's "hint".
func TestBadAddressSaysWhatIsWanted(t *testing.T) {
	want := []string{"HOST:PORT", "127.0.0.1:50051", "dns:///HOST:PORT", "unix:PATH"}
	o := fails(t, nil, 1, append([]string{"ledgerctl: BAD_ADDRESS: --addr ledger.internal: ", "no port"}, want...),
		"lookup", "x", "--addr", "ledger.internal")
	if strings.Contains(o.stderr, "LEDGER_ADDR ledger.internal") {
		t.Errorf("--addr given: the error names LEDGER_ADDR: %s", o)
	}
	fails(t, map[string]string{"LEDGER_ADDR": "ledger.internal"}, 1,
		append([]string{"ledgerctl: BAD_ADDRESS: LEDGER_ADDR ledger.internal: ", "no port"}, want...), "lookup", "x")
	fails(t, nil, 1, append([]string{"ledgerctl: BAD_ADDRESS: --addr 127.0.0.1:0: ", "port from 1 to 65535"}, want...),
		"lookup", "x", "--addr", "127.0.0.1:0")
	o = fails(t, nil, 1, nil, "--json", "lookup", "x", "--addr", "ledger.internal")
	var je jsonError
	if err := json.Unmarshal([]byte(o.stderr), &je); err != nil || je.Reason != "BAD_ADDRESS" {
		t.Fatalf("--json BAD_ADDRESS = %v: %s", err, o)
	}
	for _, w := range want {
		if !strings.Contains(je.Hint, w) {
			t.Errorf("--json BAD_ADDRESS: the hint lacks %q: %+v", w, je)
		}
	}
}

// TestGRPCTargetsWithASchemeReachTheLedger: an --addr that gRPC resolves by
// its scheme reaches the ledger, as HOST:PORT does, in each of the forms
// gRPC names: not only "scheme:///..." but "dns:HOST:PORT", "unix:" with a
// relative path and "unix-abstract:NAME", which are no HOST:PORT either
// and are not BAD_ADDRESS. The ledger answers a lookup of an operation it
// does not hold: NOT_FOUND.
func TestGRPCTargetsWithASchemeReachTheLedger(t *testing.T) {
	st := servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{})
	t.Chdir(t.TempDir())
	abstract := "ledgerctl-test-" + client.NewHolder()
	for _, path := range []string{"ledger.sock", "@" + abstract} {
		lis, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = st.Service.Serve(lis) }()
	}
	_, port, err := net.SplitHostPort(st.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// "localhost:PORT" parses as a URL too, of the scheme "localhost", which
	// gRPC has no resolver for: it is HOST:PORT.
	for _, addr := range []string{st.Addr, "localhost:" + port, "dns:" + st.Addr, "dns:///" + st.Addr, "unix:ledger.sock", "unix-abstract:" + abstract} {
		o := ctl(t, nil, "lookup", "no-such-operation", "--addr", addr, "--timeout", "20s")
		if !strings.HasPrefix(o.stderr, "ledgerctl: NOT_FOUND: ") {
			t.Errorf("ledgerctl lookup --addr %s: want the ledger's NOT_FOUND: %s", addr, o)
		}
	}
}

// TestEmptyAPIKey: an empty --api-key (an unset shell variable) is bad
// usage, like an empty --tls-ca, instead of overriding LEDGER_API_KEY with
// no key and calling the ledger without credentials.
func TestEmptyAPIKey(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	id := "wf-70:refund"
	e.markUnknown(t, id, "payments.refund", "timeout")
	for _, args := range [][]string{
		{"lookup", id, "--api-key", ""},
		{"--api-key=", "lookup", id},
		{"reconcile", id, "escalate", "--note", "x", "--api-key", "  "},
		{"--json", "list-unresolved", "--api-key="},
	} {
		fails(t, e.env, 2, []string{"ledgerctl: --api-key is empty", "usage: ledgerctl"}, args...)
		fails(t, map[string]string{"LEDGER_ADDR": e.addr}, 2, []string{"ledgerctl: --api-key is empty"}, args...)
	}
	if op := lookupJSON(t, e.env, id); op.State != "STATE_UNKNOWN" || op.NeedsReview {
		t.Errorf("after the refused calls: %+v", op)
	}
	// The key from the environment, or a flag with a key, still works.
	must(t, e.env, "lookup", id)
	must(t, map[string]string{"LEDGER_ADDR": e.addr}, "lookup", id, "--api-key", e.keys.keys["viewer"])
}

// TestDataLoneSurrogate: --data whose \u escape is half of a UTF-16
// surrogate pair is bad usage, and nothing is recorded: decoding would
// record U+FFFD in its place, as for invalid UTF-8. A whole pair is the
// character it encodes.
func TestDataLoneSurrogate(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	id := "wf-81:charge"
	e.markUnknown(t, id, "payments.charge", "timeout")
	for data, esc := range map[string]string{
		`{"name":"\ud800"}`:            `\ud800`,
		`{"\uDC00x":1}`:                `\uDC00`,
		`{"a":["\ud83d\ud83d\ude00"]}`: `\ud83d`,
		`{"a":"\\\ude00"}`:             `\ude00`,
	} {
		fails(t, e.env, 2, []string{"ledgerctl: --data: ", "the escape " + esc + " is half of a UTF-16 surrogate pair", "usage: ledgerctl"}, "reconcile", id, "applied", "--data", data)
	}
	if op := lookupJSON(t, e.env, id); op.State != "STATE_UNKNOWN" || len(op.History) != 2 {
		t.Fatalf("a refused --data was recorded: %+v", op)
	}
	must(t, e.env, "reconcile", id, "applied", "--data", `{"smile":"\ud83d\ude00","path":"\\ud800"}`)
	op := lookupJSON(t, e.env, id)
	b, _ := json.Marshal(op.Result.Data)
	if want := `{"path":"\\ud800","smile":"😀"}`; op.State != "STATE_SUCCEEDED" || string(b) != want {
		t.Fatalf("after applied: %s %s, want %s", op.State, b, want)
	}
}

// TestDataNotUTF8: --data that is not valid UTF-8 (text from a Latin-1
// terminal or file) is bad usage, and nothing is recorded: decoding would
// replace the bytes with U+FFFD, recording a result other than the one
// given.
func TestDataNotUTF8(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	id := "wf-80:charge"
	e.markUnknown(t, id, "payments.charge", "timeout")
	for _, data := range []string{"{\"name\":\"caf\xe9\"}", "{\"caf\xe9\":1}", "{\"a\":[\"\xff\"]}"} {
		fails(t, e.env, 2, []string{"ledgerctl: --data: ", "not valid UTF-8", "usage: ledgerctl"}, "reconcile", id, "applied", "--data", data)
	}
	if op := lookupJSON(t, e.env, id); op.State != "STATE_UNKNOWN" || len(op.History) != 2 {
		t.Fatalf("a refused --data was recorded: %+v", op)
	}
	must(t, e.env, "reconcile", id, "applied", "--data", `{"name":"café","esc":"\u00e9","r":"`+"\ufffd"+`"}`)
	op := lookupJSON(t, e.env, id)
	b, _ := json.Marshal(op.Result.Data)
	if want := `{"esc":"é","name":"café","r":"` + "\ufffd" + `"}`; op.State != "STATE_SUCCEEDED" || string(b) != want {
		t.Fatalf("after applied: %s %s, want %s", op.State, b, want)
	}
}

// TestTLSOffWithTLSFiles: --tls=false given with a TLS file (--tls-ca,
// --tls-cert, --tls-key, or LEDGER_TLS_CA from the environment) is bad
// usage naming both, and nothing is sent: the file would otherwise turn
// TLS back on behind the operator's back. Without --tls, a TLS file still
// implies it; --tls=false alone is plaintext.
func TestTLSOffWithTLSFiles(t *testing.T) {
	pki := newPKI(t, t.TempDir())
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	id := "wf-80:refund"
	e.markUnknown(t, id, "payments.refund", "timeout")
	envCA := map[string]string{"LEDGER_ADDR": e.addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"], "LEDGER_TLS_CA": pki.caFile}
	for _, c := range []struct {
		env  map[string]string
		args []string
		with string
	}{
		{e.env, []string{"--tls=false", "--tls-ca", pki.caFile, "reconcile", id, "escalate"}, "--tls-ca"},
		{e.env, []string{"reconcile", id, "escalate", "--tls-ca=" + pki.caFile, "--tls=false"}, "--tls-ca"},
		{e.env, []string{"reconcile", id, "escalate", "--tls=0", "--tls-cert", pki.clientCert, "--tls-key", pki.clientKey}, "--tls-cert"},
		{e.env, []string{"--tls", "--tls=false", "reconcile", id, "escalate", "--tls-cert", pki.clientCert, "--tls-key", pki.clientKey}, "--tls-cert"},
		{e.env, []string{"reconcile", id, "escalate", "--tls=false", "--tls-key", pki.clientKey}, "--tls-key"},
		{envCA, []string{"reconcile", id, "escalate", "--tls=false"}, "LEDGER_TLS_CA"},
	} {
		o := fails(t, c.env, 2, []string{"usage: ledgerctl"}, c.args...)
		line, _, _ := strings.Cut(o.stderr, "\n")
		if !strings.HasPrefix(line, "ledgerctl: --tls=false ") || !strings.Contains(line, c.with) || o.stdout != "" {
			t.Errorf("ledgerctl %q: want one line naming --tls=false and %s: %s", c.args, c.with, o)
		}
	}
	// Nothing was recorded.
	if op := lookupJSON(t, e.env, id); op.State != "STATE_UNKNOWN" || op.NeedsReview || len(op.History) != 2 {
		t.Errorf("after the refused calls: %+v", op)
	}
	// --tls=false alone is plaintext; --tls=false given and LEDGER_TLS_CA
	// empty is no conflict.
	must(t, e.env, "lookup", id, "--tls=false")
	must(t, map[string]string{"LEDGER_ADDR": e.addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"], "LEDGER_TLS_CA": ""}, "lookup", id, "--tls=false")
	// Without --tls, the CA still implies TLS: the plaintext ledger does
	// not answer it.
	fails(t, e.env, 1, []string{"ledgerctl: UNAVAILABLE: "}, "lookup", id, "--tls-ca", pki.caFile)
	fails(t, envCA, 1, []string{"ledgerctl: UNAVAILABLE: "}, "lookup", id)
}

// TestHelpCommandHelpFlag: "help <command>" with -h or --help anywhere
// prints that command's usage, as "help <command>" does, not the whole
// usage; help about a command that does not exist stays bad usage.
func TestHelpCommandHelpFlag(t *testing.T) {
	env := map[string]string{"LEDGER_ADDR": "127.0.0.1:1"}
	for _, cmd := range append([]string{"help"}, commands...) {
		want := must(t, env, "help", cmd)
		for _, args := range [][]string{{"help", cmd, "-h"}, {"help", cmd, "--help"}, {"-h", "help", cmd}, {"help", "--help", cmd}, {"--json", "help", cmd, "-h"}} {
			if o := ctl(t, env, args...); o != want {
				t.Errorf("ledgerctl %q: %s\nwant:\n%s", args, o, want)
			}
		}
	}
	if o := must(t, env, "help", "lookup"); strings.Contains(o.stdout, "list-unresolved") || !strings.Contains(o.stdout, "lookup <operation_id>") {
		t.Errorf("help lookup: %s", o)
	}
	for _, args := range [][]string{{"help", "lookups", "-h"}, {"help", "lookup", "reconcile", "--help"}} {
		want := ctl(t, env, args[:len(args)-1]...)
		if o := ctl(t, env, args...); o.code != 2 || o != want {
			t.Errorf("ledgerctl %q: %s\nwant:\n%s", args, o, want)
		}
	}
}

// TestLookupShowsCompensations: lookup names a compensation's target and a
// target's compensations, in the readable block and in --json.
func TestLookupShowsCompensations(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	ctx := context.Background()
	tok := e.reserve(t, "wf-60:charge", "payments.charge")
	if _, err := e.sdk.Complete(ctx, "wf-60:charge", tok, client.Result{ResourceID: "ch_1"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"wf-60:refund-1", "wf-60:refund-2"} {
		if _, err := e.sdk.Reserve(ctx, client.Op{ID: id, Tool: "payments.refund", Compensates: "wf-60:charge"}, client.NewHolder()); err != nil {
			t.Fatal(err)
		}
	}
	if op := lookupJSON(t, e.env, "wf-60:charge"); op.Compensates != "" || !slices.Equal(op.CompensatedBy, []string{"wf-60:refund-1", "wf-60:refund-2"}) {
		t.Fatalf("the charge: %+v", op)
	}
	if op := lookupJSON(t, e.env, "wf-60:refund-1"); op.Compensates != "wf-60:charge" || op.CompensatedBy == nil || len(op.CompensatedBy) != 0 {
		t.Fatalf("the refund: compensates %q, compensated_by %v", op.Compensates, op.CompensatedBy)
	}
	block := must(t, e.env, "lookup", "wf-60:charge").stdout
	if !regexp.MustCompile(`compensated by\s+wf-60:refund-1, wf-60:refund-2\n`).MatchString(block) ||
		!regexp.MustCompile(`compensates\s+-\n`).MatchString(block) {
		t.Fatalf("lookup:\n%s", block)
	}
}
