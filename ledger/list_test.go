package ledger

import (
	"fmt"
	"slices"
	"testing"
	"time"
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
