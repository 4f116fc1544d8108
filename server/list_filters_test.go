package server_test

import (
	"slices"
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
		var last time.Time // the latest recovery deadline of a late.* tool
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
		// late.* tools have a recovery window of 1ms; payments.* the default
		// 15 minutes.
		late := unknown("late", "late.refund")
		fresh := unknown("fresh", "payments.refund")
		lateEscalated := escalate(unknown("late-escalated", "late.charge"))
		freshEscalated := escalate(unknown("fresh-escalated", "payments.refund"))
		found := unknown("found", "late.refund")
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
			{"overdue of a tool", &ledgerv1.ListUnresolvedRequest{Overdue: true, Tool: "late.refund"}, []string{late}},
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
