package ledger

import (
	"context"
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Page sizes of ListUnresolved.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
	// maxListScan bounds the index entries one call examines, so a page
	// whose filters match little cannot turn into a scan of the whole index:
	// the call then returns a short page and a token to continue.
	maxListScan = 5 * MaxPageSize
)

// ListUnresolved pages through the tenant's operations that are not terminal
// and not under a live lease: PENDING, UNKNOWN (escalated ones included) and
// RUNNING past its lease, oldest first (by creation). The request's filters
// (States, Tool, Overdue, NeedsReview) narrow them down, all of them at once;
// Overdue compares the recovery deadline with the store's time, read with
// the records. A page may hold fewer than PageSize operations (none, even)
// while NextPageToken is set, since one call stops after examining at most
// maxListScan index entries: keep paging until it is empty.
//
// May return an *Error of KindInvalid or KindUnavailable.
func (l *Ledger) ListUnresolved(ctx context.Context, who Principal, req ListRequest) (*ListPage, error) {
	const op = "ledger.ListUnresolved"
	vs := checkPrincipal(who)
	size := req.PageSize
	if size == 0 {
		size = DefaultPageSize
	}
	if size < 0 || size > MaxPageSize {
		vs = append(vs, Violation{"page_size", "at most " + itoa(MaxPageSize)})
	}
	for _, s := range req.States {
		if s != StatePending && s != StateRunning && s != StateUnknown {
			vs = append(vs, Violation{"states", "only PENDING, RUNNING and UNKNOWN are unresolved"})
			break
		}
	}
	vs = append(vs, violations(checkTool("tool", req.Tool, false))...)
	cursor, ok := decodePageToken(req.PageToken)
	if !ok {
		vs = append(vs, Violation{"page_token", "not a token from a previous page"})
	}
	if len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	// Each listed operation is checked against the states: keep each state
	// once, so that a request repeating them costs no more per operation.
	var states []State
	for _, s := range req.States {
		if !slices.Contains(states, s) {
			states = append(states, s)
		}
	}
	req.States = states

	page := &ListPage{}
	scanned := 0
outer:
	for {
		// The last batch is cut to what remains of the bound, so a call
		// examines at most listScan entries, whatever the page size.
		members, exhausted, err := l.unresolvedAfter(ctx, who.Tenant, cursor, min(size, l.listScan-scanned))
		if err != nil {
			return nil, storeError(op, err)
		}
		ops, now, err := l.fetch(ctx, who.Tenant, members)
		if err != nil {
			return nil, storeError(op, err)
		}
		for i, m := range members {
			cursor = m
			scanned++
			if o := ops[i]; o != nil && listable(o, now, req) {
				page.Operations = append(page.Operations, o)
				if len(page.Operations) == size {
					if exhausted && i == len(members)-1 {
						cursor = ""
					}
					break outer
				}
			}
		}
		if exhausted {
			cursor = ""
			break
		}
		if scanned >= l.listScan {
			break
		}
	}
	if cursor != "" {
		page.NextPageToken = encodePageToken(cursor)
	}
	return page, nil
}

func listable(o *Operation, now time.Time, req ListRequest) bool {
	switch o.State {
	case StatePending, StateUnknown:
	case StateRunning:
		if o.LeaseExpiresAt.After(now) {
			return false
		}
	default:
		return false
	}
	if len(req.States) > 0 && !slices.Contains(req.States, o.State) {
		return false
	}
	if req.Overdue && (o.State != StateUnknown || o.RecoveryDeadline.IsZero() || o.RecoveryDeadline.After(now)) {
		return false
	}
	if req.NeedsReview && !o.NeedsReview {
		return false
	}
	return req.Tool == "" || o.Tool == req.Tool
}

// unresolvedAfter merges the tenant's unresolved index over all shards and
// returns the first limit members after cursor (all of them, with
// exhausted, when no more remain).
func (l *Ledger) unresolvedAfter(ctx context.Context, tenant, cursor string, limit int) ([]string, bool, error) {
	start := "-"
	if cursor != "" {
		start = "(" + cursor
	}
	t := encodeComponent(tenant)
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.StringSliceCmd, NumShards)
	for s := range NumShards {
		cmds[s] = pipe.ZRangeByLex(ctx, l.keys.unresolved(s, t), &redis.ZRangeBy{Min: start, Max: "+", Count: int64(limit)})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, false, err
	}
	var all []string
	exhausted := true
	for _, c := range cmds {
		v := c.Val()
		if len(v) >= limit {
			exhausted = false
		}
		all = append(all, v...)
	}
	slices.Sort(all)
	if len(all) > limit {
		all, exhausted = all[:limit], false
	}
	return all, exhausted, nil
}

// fetch reads the records of the operations the index members name, and the
// store's time, in one round trip. A record that is gone reads as nil.
func (l *Ledger) fetch(ctx context.Context, tenant string, members []string) ([]*Operation, time.Time, error) {
	pipe := l.rdb.Pipeline()
	now := pipe.Time(ctx)
	cmds := make([]*redis.StringCmd, len(members))
	ids := make([]string, len(members))
	for i, m := range members {
		_, ids[i], _ = strings.Cut(m, ":")
		cmds[i] = pipe.Get(ctx, l.keys.op(tenant, ids[i]).all[0])
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, time.Time{}, err
	}
	ops := make([]*Operation, len(members))
	var stale []string
	for i, c := range cmds {
		switch err := c.Err(); {
		case err == nil:
			if o, _, derr := decodeRecord(c.Val()); derr == nil {
				o.ID = ids[i]
				ops[i] = o
			}
		case errors.Is(err, redis.Nil):
			stale = append(stale, members[i])
		default:
			return nil, time.Time{}, err
		}
	}
	// An index entry without its record can only come from a key removed
	// behind the ledger's back (an evicting maxmemory policy, a manual DEL):
	// drop it, so it is not read again on every page.
	if len(stale) > 0 {
		pipe := l.rdb.Pipeline()
		t := encodeComponent(tenant)
		for _, m := range stale {
			_, id, _ := strings.Cut(m, ":")
			pipe.ZRem(ctx, l.keys.unresolved(shardOf(tenant, id), t), m)
		}
		_, _ = pipe.Exec(ctx) // best effort: the next page tries again
	}
	return ops, now.Val(), nil
}

// memberTime is the length of an unresolved index member's creation time:
// ms in base 36, 9 digits (common.lua, umember).
const memberTime = 9

// encodePageToken returns the page token that continues after the index
// member cursor ("<creation time, 9 base-36 digits>:<operation id>").
func encodePageToken(cursor string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(cursor))
}

// decodePageToken returns the index member a page token continues after;
// the empty token is the start. It takes only what encodePageToken writes
// for a member: a token spelled otherwise (base64 with line breaks or
// stray low bits, which the decoder would ignore) or naming no operation
// id the ledger accepts is not one.
func decodePageToken(tok string) (string, bool) {
	if tok == "" {
		return "", true
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < memberTime+2 || b[memberTime] != ':' {
		return "", false
	}
	for _, c := range b[:memberTime] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return "", false
		}
	}
	cursor := string(b)
	if encodePageToken(cursor) != tok || ValidateOperationID(cursor[memberTime+1:]) != nil {
		return "", false
	}
	return cursor, true
}
