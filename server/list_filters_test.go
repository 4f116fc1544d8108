package server_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
)

// TestListUnresolvedFilters: overdue and needs_review select through the
// API, alone, together and with states and tool, one operation a page, in a
// tenant of the test's own.
func TestListUnresolvedFilters(t *testing.T) {
	kr := newKeyring(t)
	key := kr.add(t, "lister", "lister-"+randomHex(4), "reconciler", false)
	creds := kr.creds(t, "")
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c, ctx := startSweeping(t, rdb, creds), as(key)
		var last time.Time // the latest recovery deadline of a overdue.* tool
		unknown := func(id, tool string) string {
			time.Sleep(2 * time.Millisecond) // distinct creation times
			res, err := c.Reserve(ctx, reserveReq(id, tool, nil, newHolder()))
			if err != nil || res.GetDecision() != ledgerv1.Decision_DECISION_EXECUTE {
				t.Fatalf("Reserve(%s) = %v, %v", id, res, err)
			}
			u, err := c.MarkUnknown(ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: res.GetOperation().GetFencingToken()})
			if err != nil {
				t.Fatal(err)
			}
			if d := u.GetOperation().GetRecoveryDeadline().AsTime(); tool != "payments.refund" && d.After(last) {
				last = d
			}
			return id
		}
		escalate := func(id string) string {
			if _, err := c.Reconcile(ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_ESCALATE}); err != nil {
				t.Fatal(err)
			}
			return id
		}
		// overdue.* tools have a recovery window of 1ms; payments.* the default
		// 15 minutes.
		late := unknown("late", "overdue.refund")
		fresh := unknown("fresh", "payments.refund")
		lateEscalated := escalate(unknown("late-escalated", "overdue.charge"))
		freshEscalated := escalate(unknown("fresh-escalated", "payments.refund"))
		found := unknown("found", "overdue.refund")
		if _, err := c.Reconcile(ctx, &ledgerv1.ReconcileRequest{OperationId: found, Finding: ledgerv1.Finding_FINDING_NOT_APPLIED}); err != nil {
			t.Fatal(err)
		}
		for {
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if !now.Before(last) {
				break
			}
			time.Sleep(time.Millisecond)
		}

		unknownOnly := []ledgerv1.State{ledgerv1.State_STATE_UNKNOWN}
		pendingOnly := []ledgerv1.State{ledgerv1.State_STATE_PENDING}
		for _, tc := range []struct {
			name string
			req  *ledgerv1.ListUnresolvedRequest
			want []string
		}{
			{"no filter", &ledgerv1.ListUnresolvedRequest{}, []string{late, fresh, lateEscalated, freshEscalated, found}},
			{"overdue", &ledgerv1.ListUnresolvedRequest{Overdue: true}, []string{late, lateEscalated}},
			{"needs_review", &ledgerv1.ListUnresolvedRequest{NeedsReview: true}, []string{lateEscalated, freshEscalated}},
			{"both", &ledgerv1.ListUnresolvedRequest{Overdue: true, NeedsReview: true}, []string{lateEscalated}},
			{"overdue of a tool", &ledgerv1.ListUnresolvedRequest{Overdue: true, Tool: "overdue.refund"}, []string{late}},
			{"needs_review in UNKNOWN", &ledgerv1.ListUnresolvedRequest{NeedsReview: true, States: unknownOnly}, []string{lateEscalated, freshEscalated}},
			{"overdue in PENDING", &ledgerv1.ListUnresolvedRequest{Overdue: true, States: pendingOnly}, nil},
		} {
			var got []string
			req := tc.req
			req.PageSize = 1
			for range 20 {
				page, err := c.ListUnresolved(ctx, req)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if len(page.GetOperations()) > 1 {
					t.Fatalf("%s: a page of %d, asked for 1", tc.name, len(page.GetOperations()))
				}
				for _, o := range page.GetOperations() {
					got = append(got, o.GetOperationId())
				}
				if req.PageToken = page.GetNextPageToken(); req.PageToken == "" {
					break
				}
			}
			if req.PageToken != "" || !slices.Equal(got, tc.want) {
				t.Errorf("%s = %q (next %q), want %q", tc.name, got, req.PageToken, tc.want)
			}
		}
	})
}

// TestListUnresolvedListsWhatIsUnresolved: contract.md §3: ListUnresolved pages
// through the tenant's operations that are not terminal and not under a
// live lease (PENDING, UNKNOWN, flagged for review, RUNNING past its lease),
// oldest first; a live claim and a terminal record are not listed.
func TestListUnresolvedListsWhatIsUnresolved(t *testing.T) {
	kr := newKeyring(t)
	key := kr.add(t, "lister", "unresolved-"+randomHex(4), "reconciler", false)
	creds := kr.creds(t, "")
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c, ctx := startSweeping(t, rdb, creds), as(key)
		var leaseEnd time.Time // the latest lease of a expiring.* claim
		claim := func(id, tool string) uint64 {
			time.Sleep(2 * time.Millisecond) // distinct creation times
			res, err := c.Reserve(ctx, reserveReq(id, tool, nil, newHolder()))
			if err != nil || res.GetDecision() != ledgerv1.Decision_DECISION_EXECUTE {
				t.Fatalf("Reserve(%s) = %v, %v", id, res, err)
			}
			if end := res.GetOperation().GetLeaseExpiresAt().AsTime(); strings.HasPrefix(tool, "expiring.") && end.After(leaseEnd) {
				leaseEnd = end
			}
			return res.GetOperation().GetFencingToken()
		}
		complete := func(id string, tok uint64, outcome ledgerv1.Outcome) {
			req := &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok, Outcome: outcome}
			if outcome != ledgerv1.Outcome_OUTCOME_SUCCEEDED {
				req.Failure = &ledgerv1.Failure{Code: "declined"}
			}
			if _, err := c.Complete(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
		lookup := func(id string) *ledgerv1.Operation {
			r, err := c.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: id})
			if err != nil {
				t.Fatal(err)
			}
			return r.GetOperation()
		}

		claim("live", "payments.refund")
		complete("done", claim("done", "payments.refund"), ledgerv1.Outcome_OUTCOME_SUCCEEDED)
		complete("failed", claim("failed", "payments.refund"), ledgerv1.Outcome_OUTCOME_FAILED_FINAL)
		complete("pending", claim("pending", "payments.refund"), ledgerv1.Outcome_OUTCOME_FAILED_RETRYABLE)
		if _, err := c.MarkUnknown(ctx, &ledgerv1.MarkUnknownRequest{OperationId: "unknown", FencingToken: claim("unknown", "payments.refund")}); err != nil {
			t.Fatal(err)
		}
		claim("past-lease", "expiring.idempotent") // stays RUNNING past its lease
		claim("swept", "expiring.refund")          // the sweeper makes it UNKNOWN
		if _, err := c.MarkUnknown(ctx, &ledgerv1.MarkUnknownRequest{OperationId: "escalated", FencingToken: claim("escalated", "payments.refund")}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Reconcile(ctx, &ledgerv1.ReconcileRequest{OperationId: "escalated", Finding: ledgerv1.Finding_FINDING_ESCALATE}); err != nil {
			t.Fatal(err)
		}
		for {
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if now.After(leaseEnd) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		deadline := time.Now().Add(10 * time.Second)
		for lookup("swept").GetState() != ledgerv1.State_STATE_UNKNOWN {
			if time.Now().After(deadline) {
				t.Fatal("the irreversible claim past its lease was never swept")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if st := lookup("past-lease").GetState(); st != ledgerv1.State_STATE_RUNNING {
			t.Fatalf("past-lease is %v, want RUNNING", st)
		}

		for _, tc := range []struct {
			states []ledgerv1.State
			want   []string
		}{
			{nil, []string{"pending", "unknown", "past-lease", "swept", "escalated"}},
			{[]ledgerv1.State{ledgerv1.State_STATE_RUNNING}, []string{"past-lease"}},
		} {
			var got []string
			var prev time.Time
			req := &ledgerv1.ListUnresolvedRequest{PageSize: 2, States: tc.states}
			for range 20 {
				page, err := c.ListUnresolved(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range page.GetOperations() {
					got = append(got, o.GetOperationId())
					if created := o.GetCreatedAt().AsTime(); created.Before(prev) {
						t.Errorf("%s (created %v) listed after an operation created at %v", o.GetOperationId(), created, prev)
					} else {
						prev = created
					}
					if len(o.GetHistory()) != 0 {
						t.Errorf("%s listed with its history", o.GetOperationId())
					}
				}
				if req.PageToken = page.GetNextPageToken(); req.PageToken == "" {
					break
				}
			}
			if req.PageToken != "" || !slices.Equal(got, tc.want) {
				t.Errorf("states %v: listed %q (next %q), want %q", tc.states, got, req.PageToken, tc.want)
			}
		}
	})
}
