package ledger

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The ages after which a tenant's tally is read again: farAge while the
// tenant is well below its limit, nearAge within quotaSlack of it (and
// before a refusal is answered).
const (
	farAge  = time.Second
	nearAge = 10 * time.Millisecond
)

// quotaSlack is how far below limit a tenant counts as near it.
func quotaSlack(limit int) int64 {
	return max(int64(limit)/10, 16)
}

// quotas holds a tally per tenant with an unresolved limit.
type quotas struct {
	mu      sync.Mutex
	tenants map[string]*tally
	pruned  time.Time
}

// tally is what this instance knows of one tenant's unresolved
// operations: how many the last refresh counted, how many it created since,
// and how many Reserves hold a grant now. A Reserve that may create an
// operation needs a grant, so one instance never passes the limit; one
// without a grant may only find an existing operation.
type tally struct {
	refresh  sync.Mutex // one refresh at a time
	mu       sync.Mutex // the fields below
	counted  int64
	added    int64
	granted  int64
	at, used time.Time
}

// get returns the tally of tenant, creating it, and drops tallies unused
// for a minute that hold no grant (checked at most once a minute); now is
// the time.
func (q *quotas) get(tenant string, now time.Time) *tally {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.tenants == nil {
		q.tenants = map[string]*tally{}
	}
	if now.Sub(q.pruned) > time.Minute {
		for name, t := range q.tenants {
			t.mu.Lock()
			// A grant's Reserve may still create an operation: its tally
			// must count it.
			idle := now.Sub(t.used) > time.Minute && t.granted == 0
			t.mu.Unlock()
			if idle {
				delete(q.tenants, name)
			}
		}
		q.pruned = now
	}
	t := q.tenants[tenant]
	if t == nil {
		t = &tally{}
		q.tenants[tenant] = t
	}
	return t
}

// stale reports whether the tally should be read again before a Reserve
// under limit, at now.
func (t *tally) stale(limit int, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	age := now.Sub(t.at)
	if t.at.IsZero() || age > farAge {
		return true
	}
	return age > nearAge && t.roomLocked(limit) <= quotaSlack(limit)
}

func (t *tally) roomLocked(limit int) int64 {
	return int64(limit) - t.counted - t.added - t.granted
}

// begin takes a grant when the limit leaves room for one, at now.
func (t *tally) begin(limit int, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.used = now
	if t.roomLocked(limit) < 1 {
		return false
	}
	t.granted++
	return true
}

// end returns a grant, counting the operation when the Reserve created it.
func (t *tally) end(created bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.granted--
	if created {
		t.added++
	}
}

// read counts the tenant's unresolved operations in every shard, in one
// pipeline, unless a count started after since is already in.
func (t *tally) read(ctx context.Context, rdb redis.UniversalClient, k keyspace, tenant string, since time.Time) error {
	t.refresh.Lock()
	defer t.refresh.Unlock()
	t.mu.Lock()
	fresh := t.at.After(since)
	before := t.added
	t.mu.Unlock()
	if fresh {
		return nil
	}
	start := time.Now()
	enc := encodeComponent(tenant)
	pipe := rdb.Pipeline()
	cmds := make([]*redis.IntCmd, NumShards)
	for j := range NumShards {
		cmds[j] = pipe.ZCard(ctx, k.unresolved(j, enc))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	var n int64
	for _, c := range cmds {
		n += c.Val()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// Creations answered before the read are in its count; the others
	// stay counted as added (at worst twice, never not at all).
	t.counted, t.added = n, t.added-before
	t.at = start
	return nil
}

// reserveWithin runs a Reserve script under the tenant's unresolved limit:
// call gets "" (no limit, or a grant: it may create) or 0 (it may not).
// Before it refuses, it counts again and tries once more.
func (l *Ledger) reserveWithin(ctx context.Context, tenant string, k opKeys, limit int, call func(room any) (int64, string, *record, error)) (int64, string, *record, error) {
	if limit <= 0 {
		return call("")
	}
	now := time.Now() // one clock read for the tally's checks
	t := l.quotas.get(tenant, now)
	since := now.Add(-nearAge)
	if !t.stale(limit, now) {
		since = time.Time{}
	}
	for try := 0; ; try++ {
		if !since.IsZero() {
			if err := t.read(ctx, l.rdb, l.keys, tenant, since); err != nil {
				return 0, "", nil, storeError("ledger.Reserve", err)
			}
		}
		if !t.begin(limit, now) {
			code, aux, rec, err := call(0)
			if code != codeQuota || try > 0 || err != nil {
				return code, aux, rec, err
			}
			since = time.Now()
			continue
		}
		code, aux, rec, err := call("")
		t.end(err == nil && rec != nil && rec.moved && rec.from == StateUnspecified)
		return code, aux, rec, err
	}
}
