package ledger

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redistest"
)

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
	pol, err := ParsePolicies([]byte(testPolicy))
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
