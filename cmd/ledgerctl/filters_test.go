package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// TestListFilters: --overdue and --needs-review are sent to the ledger, which
// returns only the operations that match; against a ledger older than those
// filters, which returns every UNKNOWN operation, ledgerctl prints the same.
func TestListFilters(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		e := newLedgerEnv(t, rdb)
		// overdue.* tools have a recovery window of 10ms; payments.* the
		// default 15 minutes.
		late := "wf-1:charge"
		e.markUnknown(t, late, "overdue.charge", "read timeout")
		fresh := "wf-2:refund"
		e.markUnknown(t, fresh, "payments.refund", "gateway timeout")
		lateEscalated := "wf-3:charge"
		e.markUnknown(t, lateEscalated, "overdue.charge", "read timeout")
		must(t, e.env, "reconcile", lateEscalated, "escalate")
		freshEscalated := "wf-4:refund"
		e.markUnknown(t, freshEscalated, "payments.refund", "gateway timeout")
		must(t, e.env, "reconcile", freshEscalated, "escalate")
		pending := "wf-5:refund"
		tok := e.reserve(t, pending, "payments.refund")
		if _, err := e.sdk.Fail(context.Background(), pending, tok, false, client.Failure{Code: "RATE_LIMITED"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // past the 10ms recovery windows

		for _, old := range []bool{false, true} {
			p, addr := startProxy(t, e.addr, old)
			env := map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"]}
			for _, c := range []struct {
				flags []string
				want  []string
			}{
				{[]string{"--overdue"}, []string{late, lateEscalated}},
				{[]string{"--needs-review"}, []string{lateEscalated, freshEscalated}},
				{[]string{"--overdue", "--needs-review"}, []string{lateEscalated}},
				{[]string{"--needs-review", "--tool", "payments.refund"}, []string{freshEscalated}},
				{[]string{"--overdue", "--limit", "1"}, []string{late}},
			} {
				ids, l := listIDs(t, env, c.flags...)
				if !slices.Equal(ids, c.want) {
					t.Errorf("old ledger %v: list-unresolved %q = %q, want %q", old, c.flags, ids, c.want)
				}
				if truncated := slices.Contains(c.flags, "--limit"); l.Truncated != truncated {
					t.Errorf("old ledger %v: list-unresolved %q: truncated %v", old, c.flags, l.Truncated)
				}
				// The ledger filters: it sends only what is printed (and
				// one more with --limit, which tells that more remain).
				// An older ledger sends UNKNOWN operations that do not
				// match, and ledgerctl leaves them out.
				n, _ := p.take()
				want := len(c.want)
				if slices.Contains(c.flags, "--limit") {
					want++
				}
				if !old && n != want {
					t.Errorf("list-unresolved %q: the ledger returned %d operations, want %d", c.flags, n, want)
				}
				if old && n <= len(c.want) {
					t.Errorf("old ledger: list-unresolved %q: the ledger returned %d operations, want more than the %d printed", c.flags, n, len(c.want))
				}
			}
		}
	})
}

// TestOverdueAcrossPages: whether this machine's clock is behind the
// store's is decided once, over every page read, so a listing of several
// pages judges all its operations alike. A first page whose times do not
// show the clock behind must not have its operations dropped by this
// machine's clock when a later page shows it behind: the ledger selected
// them, by the store's clock, as it did the later ones.
func TestOverdueAcrossPages(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	first, second := "wf-60:charge", "wf-61:charge"
	e.markUnknown(t, first, "overdue.charge", "read timeout")
	op, err := e.sdk.Lookup(context.Background(), first)
	if err != nil {
		t.Fatal(err)
	}
	// The second operation's times are more than skewTolerance after the
	// first's.
	time.Sleep(skewTolerance + 100*time.Millisecond)
	e.markUnknown(t, second, "overdue.charge", "read timeout")
	time.Sleep(20 * time.Millisecond) // both past their 10ms recovery windows

	// This machine's clock reads just after the first operation went
	// UNKNOWN, before its recovery deadline: behind the store's, which the
	// first page alone does not show.
	local := op.UnknownSince.Add(5 * time.Millisecond)
	defer func(c func() time.Time) { clock = c }(clock)
	clock = func() time.Time { return local }
	defer func(n int) { maxPageSize = n }(maxPageSize)
	maxPageSize = 1

	for _, old := range []bool{false, true} {
		_, addr := startProxy(t, e.addr, old)
		env := map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"]}
		for _, flags := range [][]string{{"--overdue"}, {"--overdue", "--limit", "1"}} {
			want := []string{first, second}
			if slices.Contains(flags, "--limit") {
				want = want[:1]
			}
			ids, l := listIDs(t, env, flags...)
			if !slices.Equal(ids, want) {
				t.Errorf("old ledger %v: list-unresolved %q = %q, want %q", old, flags, ids, want)
			}
			if truncated := slices.Contains(flags, "--limit"); l.Truncated != truncated {
				t.Errorf("old ledger %v: list-unresolved %q: truncated %v", old, flags, l.Truncated)
			}
			if codes := (jsonDoc{Notices: l.Notices}).codes(); !slices.Contains(codes, "CLOCK_BEHIND") {
				t.Errorf("old ledger %v: list-unresolved %q: notices %q", old, flags, codes)
			}
		}
	}
}

// TestListStopsAtAStuckPage: a ledger that answers the same page token
// twice would page forever; ledgerctl stops at the second, exits 1 and
// says why (BAD_PAGE), before it prints a listing.
func TestListStopsAtAStuckPage(t *testing.T) {
	e := newLedgerEnv(t, redistest.Shared(t).Client(t))
	e.markUnknown(t, "wf-70:charge", "payments.charge", "read timeout")
	p, addr := startProxy(t, e.addr, false)
	p.stuckToken = "page-2"
	env := map[string]string{"LEDGER_ADDR": addr, "LEDGER_API_KEY": e.env["LEDGER_API_KEY"]}
	for _, args := range [][]string{
		{"list-unresolved"},
		{"list-unresolved", "--json"},
	} {
		o := ctl(t, env, args...)
		if o.code != 1 || !strings.Contains(o.stdout+o.stderr, "BAD_PAGE") || strings.Contains(o.stdout, "wf-70:charge") {
			t.Errorf("ledgerctl %q against a ledger whose pages do not advance: %s", args, o)
		}
	}
}
