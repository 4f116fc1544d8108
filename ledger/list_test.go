package ledger

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestListUnresolved(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// In creation order: what the list must return, oldest first.
		var want []string
		mk := func(id, tool string) *Operation {
			time.Sleep(2 * time.Millisecond) // distinct creation times
			return e.execute(t, id, tool)
		}
		for i := range 7 {
			id := fmt.Sprintf("unknown-%d", i)
			o := mk(id, "payments.refund")
			if _, err := e.markUnknown(t, id, o.FencingToken); err != nil {
				t.Fatal(err)
			}
			want = append(want, id)
		}
		p := mk("pending", "payments.charge")
		if _, err := e.complete(t, "pending", p.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
			t.Fatal(err)
		}
		want = append(want, "pending")
		mk("expired", "expiring.refund")
		want = append(want, "expired")
		mk("live", "payments.refund") // a live lease: not listed
		d := mk("done", "payments.refund")
		if _, err := e.complete(t, "done", d.FencingToken, OutcomeSucceeded, nil, nil); err != nil {
			t.Fatal(err)
		}
		waitLeaseExpiry()

		all, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(all.Operations); !slices.Equal(got, want) || all.NextPageToken != "" {
			t.Fatalf("list = %v (next %q), want %v", got, all.NextPageToken, want)
		}

		// Pages of 2 return the same operations, in order, each once.
		var paged []string
		tok := ""
		for range 20 {
			page, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{PageSize: 2, PageToken: tok})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Operations) > 2 {
				t.Fatalf("page of %d", len(page.Operations))
			}
			paged = append(paged, ids(page.Operations)...)
			if tok = page.NextPageToken; tok == "" {
				break
			}
		}
		if !slices.Equal(paged, want) {
			t.Fatalf("paged = %v, want %v", paged, want)
		}

		only, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{States: []State{StatePending, StateRunning}})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(only.Operations); !slices.Equal(got, []string{"pending", "expired"}) {
			t.Fatalf("PENDING+RUNNING = %v", got)
		}
		// States repeated many times select the same operations.
		repeated := make([]State, 0, 100_000)
		for len(repeated) < cap(repeated) {
			repeated = append(repeated, StateRunning, StatePending)
		}
		again, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{States: repeated})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(again.Operations); !slices.Equal(got, []string{"pending", "expired"}) {
			t.Fatalf("PENDING+RUNNING repeated = %v", got)
		}
		byTool, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{Tool: "payments.charge"})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(byTool.Operations); !slices.Equal(got, []string{"pending"}) {
			t.Fatalf("by tool = %v", got)
		}

		// Another tenant sees none of them.
		other := e.who
		other.Tenant += "-other"
		none, err := e.l.ListUnresolved(e.ctx, other, ListRequest{})
		if err != nil || len(none.Operations) != 0 {
			t.Fatalf("other tenant sees %v (%v)", ids(none.Operations), err)
		}
	})
}

func ids(ops []*Operation) []string {
	var out []string
	for _, o := range ops {
		out = append(out, o.ID)
	}
	return out
}

// TestListUnresolvedFilters: Overdue and NeedsReview select on the ledger's
// side, alone, together (AND) and with States and Tool, over pages of every
// size, and over short pages when a call may examine only a few index
// entries: each matching operation is listed once, in order.
func TestListUnresolvedFilters(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		var overdue, review, both, overdueRefund []string
		var deadlines []time.Time
		execute := func(id, tool string) *Operation {
			time.Sleep(2 * time.Millisecond) // distinct creation times
			return e.execute(t, id, tool)
		}
		unknown := func(id, tool string) *Operation {
			o := execute(id, tool)
			u, err := e.markUnknown(t, id, o.FencingToken)
			if err != nil {
				t.Fatal(err)
			}
			if tool != "payments.refund" {
				deadlines = append(deadlines, u.RecoveryDeadline)
			}
			return u
		}
		escalate := func(id string) {
			if _, err := e.reconcile(t, id, FindingEscalate, nil); err != nil {
				t.Fatal(err)
			}
		}
		// overdue.* tools have a recovery window of 1ms; payments.* the
		// default 15 minutes.
		for i := range 3 {
			n := fmt.Sprint(i)
			tool := "overdue.refund"
			if i == 1 {
				tool = "overdue.charge"
			}
			unknown("late-"+n, tool)
			overdue = append(overdue, "late-"+n)
			if tool == "overdue.refund" {
				overdueRefund = append(overdueRefund, "late-"+n)
			}
			unknown("fresh-"+n, "payments.refund")
			p := execute("pending-"+n, "overdue.refund")
			if _, err := e.complete(t, "pending-"+n, p.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
				t.Fatal(err)
			}
			unknown("late-escalated-"+n, "overdue.refund")
			escalate("late-escalated-" + n)
			overdue = append(overdue, "late-escalated-"+n)
			overdueRefund = append(overdueRefund, "late-escalated-"+n)
			review = append(review, "late-escalated-"+n)
			both = append(both, "late-escalated-"+n)
			unknown("fresh-escalated-"+n, "payments.refund")
			escalate("fresh-escalated-" + n)
			review = append(review, "fresh-escalated-"+n)
			// Overdue once, then found not applied: PENDING, neither.
			unknown("found-"+n, "overdue.refund")
			if _, err := e.reconcile(t, "found-"+n, FindingNotApplied, nil); err != nil {
				t.Fatal(err)
			}
			// Overdue and escalated once, then resolved: not listed.
			unknown("done-"+n, "overdue.refund")
			escalate("done-" + n)
			if _, err := e.reconcile(t, "done-"+n, FindingApplied, nil); err != nil {
				t.Fatal(err)
			}
		}
		e.execute(t, "live", "overdue.refund") // a live lease: not listed
		// Past every 1ms recovery deadline, by the store's clock.
		for {
			now, err := e.rdb.Time(e.ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if !now.Before(slices.MaxFunc(deadlines, time.Time.Compare)) {
				break
			}
			time.Sleep(time.Millisecond)
		}

		for _, c := range []struct {
			name string
			req  ListRequest
			want []string
		}{
			{"overdue", ListRequest{Overdue: true}, overdue},
			{"needs review", ListRequest{NeedsReview: true}, review},
			{"overdue and needs review", ListRequest{Overdue: true, NeedsReview: true}, both},
			{"overdue of a tool", ListRequest{Overdue: true, Tool: "overdue.refund"}, overdueRefund},
			{"overdue among UNKNOWN and PENDING", ListRequest{Overdue: true, States: []State{StateUnknown, StatePending}}, overdue},
			{"overdue among PENDING", ListRequest{Overdue: true, States: []State{StatePending}}, nil},
			{"needs review among RUNNING", ListRequest{NeedsReview: true, States: []State{StateRunning}}, nil},
			{"needs review of a tool", ListRequest{NeedsReview: true, Tool: "payments.refund"},
				[]string{"fresh-escalated-0", "fresh-escalated-1", "fresh-escalated-2"}},
		} {
			for _, scan := range []int{maxListScan, 3} {
				e.l.listScan = scan
				for _, size := range []int{0, 1, 2, 4} {
					req := c.req
					req.PageSize = size
					var got []string
					short := false
					pages := 0
					for {
						page, err := e.l.ListUnresolved(e.ctx, e.who, req)
						if err != nil {
							t.Fatalf("%s: %v", c.name, err)
						}
						if pages++; pages > 100 {
							t.Fatalf("%s (page size %d, scan %d): no end after %d pages", c.name, size, scan, pages)
						}
						if size > 0 && len(page.Operations) > size {
							t.Fatalf("%s: page of %d, asked for %d", c.name, len(page.Operations), size)
						}
						got = append(got, ids(page.Operations)...)
						if req.PageToken = page.NextPageToken; req.PageToken == "" {
							break
						}
						if len(page.Operations) < max(size, 1) {
							short = true
						}
					}
					if !slices.Equal(got, c.want) {
						t.Errorf("%s (page size %d, scan %d) = %v, want %v", c.name, size, scan, got, c.want)
					}
					// Examining at most 3 index entries a call, pages of
					// 2 and 4 come short with a token.
					if scan == 3 && (size == 2 || size == 4) && !short {
						t.Errorf("%s (page size %d, scan 3): no short page with a token", c.name, size)
					}
				}
			}
		}
	})
}

// recordReads counts the records a client reads with GET: ListUnresolved
// reads one per index entry it examines.
type recordReads struct{ n atomic.Int64 }

func (h *recordReads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *recordReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *recordReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}

func (h *recordReads) count(cmd redis.Cmder) {
	if cmd.Name() == "get" {
		h.n.Add(1)
	}
}

// TestListUnresolvedScanBound: one call examines at most the scan bound of
// index entries, also when the bound is not a multiple of the page size
// (the last batch is cut to what remains of it), and paging on from its
// token examines each entry once.
func TestListUnresolvedScanBound(t *testing.T) {
	pol, err := ParsePolicies([]byte(ledgertest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Shared(t).Client(t)
	reads := &recordReads{}
	rdb.AddHook(reads)
	e := newEnv(t, rdb, pol)
	// Live leases: in the unresolved index, examined, never listed.
	const n = 23
	for i := range n {
		e.execute(t, fmt.Sprintf("live-%02d", i), "payments.refund")
	}
	for _, c := range []struct{ scan, size int }{{5, 3}, {7, 2}, {10, 4}, {5, 5}, {3, 4}} {
		e.l.listScan = c.scan
		reads.n.Store(0)
		page, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{PageSize: c.size})
		if err != nil {
			t.Fatal(err)
		}
		if got := reads.n.Load(); got != int64(c.scan) || len(page.Operations) != 0 || page.NextPageToken == "" {
			t.Errorf("scan %d, page size %d: examined %d entries (page of %d, token %q), want %d and a token",
				c.scan, c.size, got, len(page.Operations), page.NextPageToken, c.scan)
		}
		// Paging to the end examines every entry once.
		reads.n.Store(0)
		calls := 0
		for req := (ListRequest{PageSize: c.size}); ; calls++ {
			page, err := e.l.ListUnresolved(e.ctx, e.who, req)
			if err != nil {
				t.Fatal(err)
			}
			if req.PageToken = page.NextPageToken; req.PageToken == "" {
				break
			}
		}
		if got := reads.n.Load(); got != n {
			t.Errorf("scan %d, page size %d: paging examined %d entries in %d calls, want %d", c.scan, c.size, got, calls+1, n)
		}
	}
}

// FuzzDecodePageToken: a ListUnresolved page token is untrusted input. It
// decodes only to an index member ("<creation time, 9 base-36
// digits>:<operation id>", the id one the ledger accepts), and only when it is exactly the
// token ListUnresolved would have written for that member; every member
// the index can hold survives the round trip.
func FuzzDecodePageToken(f *testing.F) {
	for _, s := range []string{
		"", "MGxveXczdjI4OmEtMQ", "MGxveXczdjI4OmEtMQ==", "MGxveXczdjI4Og", "MTcwMDAwMDAwMDAwMDphLTE", "not a token", "////", "-_-_",
	} {
		f.Add(s, int64(1700000000000), "wf-8472:create-ticket")
	}
	f.Fuzz(func(t *testing.T, tok string, createdMs int64, id string) {
		cursor, ok := decodePageToken(tok)
		if ok {
			if (tok == "") != (cursor == "") {
				t.Fatalf("token %q decodes to %q", tok, cursor)
			}
			if tok != "" {
				if again := encodePageToken(cursor); again != tok {
					t.Fatalf("token %q decodes to %q, whose token is %q", tok, cursor, again)
				}
				if len(cursor) < memberTime+2 || cursor[memberTime] != ':' || strings.Trim(cursor[:memberTime], "0123456789abcdefghijklmnopqrstuvwxyz") != "" {
					t.Fatalf("token %q decodes to %q, not an index member", tok, cursor)
				}
				if err := ValidateOperationID(cursor[memberTime+1:]); err != nil {
					t.Fatalf("token %q decodes to %q, whose id is refused: %v", tok, cursor, err)
				}
			}
		} else if cursor != "" {
			t.Fatalf("refused token %q decodes to %q", tok, cursor)
		}
		if createdMs < 0 || createdMs >= 101559956668416 || ValidateOperationID(id) != nil { // 36^9
			return
		}
		member := fmt.Sprintf("%09s:%s", strconv.FormatInt(createdMs, 36), id)
		if got, ok := decodePageToken(encodePageToken(member)); !ok || got != member {
			t.Fatalf("member %q comes back as %q, %v", member, got, ok)
		}
	})
}

// TestDecodePageTokenRefusesOtherSpellings: the base64 decoder ignores line
// breaks and the low bits of the last character; a token spelled so, or
// naming no valid operation id, is not one the ledger wrote.
func TestDecodePageTokenRefusesOtherSpellings(t *testing.T) {
	good := encodePageToken("0loyw3v28:a-1")
	if c, ok := decodePageToken(good); !ok || c != "0loyw3v28:a-1" {
		t.Fatalf("%q: %q, %v", good, c, ok)
	}
	for _, tok := range []string{
		"MGxveXczdjI4OmEtMR",              // low bits set
		"MGxveXczdjI4\nOmEtMQ",            // a line break
		"MGxveXczdjI4OmEtMQ\r\n",          // a trailing CRLF
		encodePageToken("0loyw3v28:\n"),   // a control character
		encodePageToken("0loyw3v28:\xff"), // not UTF-8
		encodePageToken("0loyw3v28:" + strings.Repeat("a", MaxOperationIDLen+1)),
		encodePageToken("0LOYW3V28:a-1"),     // upper-case digits
		encodePageToken("1700000000000:a-1"), // a time in decimal
		encodePageToken("loyw3v28:a-1"),      // 8 digits
	} {
		if c, ok := decodePageToken(tok); ok {
			t.Errorf("%q decodes to %q", tok, c)
		}
	}
}

// TestListUnresolvedDropsStaleEntries: an index entry whose record was
// removed behind the ledger's back (evicted, or deleted by hand) is not
// listed, and the listing drops it from the index, so no later page reads
// it again; the other operations are listed as before.
func TestListUnresolvedDropsStaleEntries(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		for _, id := range []string{"kept", "evicted"} {
			o := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, o.FencingToken); err != nil {
				t.Fatal(err)
			}
		}
		k := e.l.keys.op(e.who.Tenant, "evicted")
		if err := e.rdb.Del(e.ctx, k.all[0]).Err(); err != nil {
			t.Fatal(err)
		}
		indexed := func() bool {
			members, err := e.rdb.ZRange(e.ctx, k.all[1], 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			return slices.ContainsFunc(members, func(m string) bool { return strings.HasSuffix(m, ":evicted") })
		}
		if !indexed() {
			t.Fatal("the evicted operation is not in the index to begin with")
		}
		for range 2 {
			page, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{})
			if err != nil || !slices.Equal(ids(page.Operations), []string{"kept"}) {
				t.Fatalf("list = %v, %v; want [kept]", ids(page.Operations), err)
			}
		}
		if indexed() {
			t.Fatal("the index still holds the operation whose record is gone")
		}
	})
}
