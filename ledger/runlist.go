package ledger

import (
	"cmp"
	"context"
	"encoding/base64"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Page sizes of ListRuns.
const (
	DefaultRunPageSize = 50
	MaxRunPageSize     = 500
)

// RunPage is one page of ListRuns.
type RunPage struct {
	Runs          []*Run
	NextPageToken string // empty when there are no more
}

// runEntry is a run in its shard's index.
type runEntry struct {
	score  float64
	member string
	shard  int
}

// ListRuns pages through the tenant's runs: running ones first, the newest
// first, then ended ones, the latest ended first. A running run whose
// deadline has passed is listed as RunStateDeadline, as GetRun would end
// it. With states, only runs in those states are listed (as listed: a
// running run past its deadline counts as RunStateDeadline). A page may
// hold fewer than pageSize runs while NextPageToken is set (runs whose
// retention ended meanwhile, or in other states, are left out).
//
// May return an *Error of KindInvalid or KindUnavailable.
func (l *Ledger) ListRuns(ctx context.Context, who Principal, pageSize int, pageToken string, states ...RunState) (*RunPage, error) {
	const op = "ledger.ListRuns"
	vs := checkPrincipal(who)
	if pageSize == 0 {
		pageSize = DefaultRunPageSize
	}
	if pageSize < 0 || pageSize > MaxRunPageSize {
		vs = append(vs, Violation{"page_size", "at most " + itoa(MaxRunPageSize)})
	}
	cursor, after, ok := decodeRunToken(pageToken)
	if !ok {
		vs = append(vs, Violation{"page_token", "not a token from a previous page"})
	}
	for _, st := range states {
		if st == RunStateUnspecified || st > RunStateCancelled {
			vs = append(vs, Violation{"states", "unknown run state " + st.String()})
			break
		}
	}
	if len(vs) > 0 {
		return nil, invalid(op, vs...)
	}
	tenant := encodeComponent(who.Tenant)
	entries, more, err := l.runsAfter(ctx, tenant, cursor, after, pageSize, rangeOf(states))
	if err != nil {
		return nil, storeError(op, err)
	}
	page := &RunPage{}
	if len(entries) > 0 {
		if page.Runs, err = l.readRuns(ctx, tenant, entries); err != nil {
			return nil, storeError(op, err)
		}
	}
	if len(states) > 0 {
		page.Runs = slices.DeleteFunc(page.Runs, func(r *Run) bool { return !slices.Contains(states, r.State) })
	}
	if more {
		page.NextPageToken = encodeRunToken(entries[len(entries)-1])
	}
	return page, nil
}

// runRange is a part of the run index: running runs score below 0,
// ended ones from 0 on.
type runRange int

const (
	allRuns runRange = iota
	runningRuns
	endedRuns
)

// rangeOf is the part of the run index that may hold runs listed in states
// (all of it for none); a running run past its deadline is listed as
// RunStateDeadline.
func rangeOf(states []RunState) runRange {
	if len(states) == 0 {
		return allRuns
	}
	running := slices.Contains(states, RunStateRunning) || slices.Contains(states, RunStateDeadline)
	ended := slices.ContainsFunc(states, func(s RunState) bool { return s != RunStateRunning })
	switch {
	case !ended:
		return runningRuns
	case !running:
		return endedRuns
	}
	return allRuns
}

// bounds are r's ZRANGEBYSCORE bounds.
func (r runRange) bounds() (lo, hi string) {
	switch r {
	case runningRuns:
		return "-inf", "(0"
	case endedRuns:
		return "0", "+inf"
	}
	return "-inf", "+inf"
}

// place says where score lies against r: -1 below, 0 in, 1 above.
func (r runRange) place(score float64) int {
	switch {
	case r == runningRuns && score >= 0:
		return 1
	case r == endedRuns && score < 0:
		return -1
	}
	return 0
}

// runsAfter returns the first n index entries of the tenant's runs in r
// after cursor (from r's start when after is false, or when the cursor is
// before r), and whether more follow.
func (l *Ledger) runsAfter(ctx context.Context, tenant string, cursor runEntry, after bool, n int, r runRange) ([]runEntry, bool, error) {
	from, hi := r.bounds()
	if after {
		switch r.place(cursor.score) {
		case 1:
			return nil, false, nil
		case -1:
			after = false
		default:
			from = "(" + formatScore(cursor.score)
		}
	}
	pipe := l.rdb.Pipeline()
	ties := make([]*redis.ZSliceCmd, NumShards)
	rest := make([]*redis.ZSliceCmd, NumShards)
	for s := range NumShards {
		key := l.keys.runIndex(s, tenant)
		if after {
			ties[s] = pipe.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: formatScore(cursor.score), Max: formatScore(cursor.score)})
		}
		rest[s] = pipe.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: from, Max: hi, Count: int64(n)})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, false, err
	}
	var all []runEntry
	more := false
	for s := range NumShards {
		if ties[s] != nil {
			for _, z := range ties[s].Val() {
				if m, _ := z.Member.(string); m > cursor.member {
					all = append(all, runEntry{z.Score, m, s})
				}
			}
		}
		zs := rest[s].Val()
		more = more || len(zs) == n
		for _, z := range zs {
			m, _ := z.Member.(string)
			all = append(all, runEntry{z.Score, m, s})
		}
	}
	slices.SortFunc(all, func(a, b runEntry) int {
		return cmp.Or(cmp.Compare(a.score, b.score), strings.Compare(a.member, b.member))
	})
	if len(all) > n {
		all, more = all[:n], true
	}
	return all, more, nil
}

// readRuns reads the runs of entries, leaving out (and unlisting) those
// whose record is gone.
func (l *Ledger) readRuns(ctx context.Context, tenant string, entries []runEntry) ([]*Run, error) {
	pipe := l.rdb.Pipeline()
	now := pipe.Time(ctx)
	cmds := make([]*redis.SliceCmd, len(entries))
	for i, en := range entries {
		cmds[i] = pipe.HMGet(ctx, l.keys.runRecord(en.shard, tenant, en.member), runFields[:]...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	var runs []*Run
	gone := l.rdb.Pipeline() // the index entries of expired runs
	for i, c := range cmds {
		id, err := decodeComponent(entries[i].member)
		if err != nil {
			continue
		}
		f := c.Val()
		if len(f) != len(runFields) || f[0] == nil {
			gone.ZRem(ctx, l.keys.runIndex(entries[i].shard, tenant), entries[i].member)
			continue
		}
		r := decodeRun(id, f)
		if r.State == RunStateRunning && !r.DeadlineAt.IsZero() && !now.Val().Before(r.DeadlineAt) {
			r.State, r.EndedAt, r.EndReason = RunStateDeadline, r.DeadlineAt, "the deadline passed"
		}
		runs = append(runs, r)
	}
	if gone.Len() > 0 {
		_, _ = gone.Exec(ctx) // what is left is removed by a later listing
	}
	return runs, nil
}

func formatScore(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// encodeRunToken writes the cursor after entry as a page token.
func encodeRunToken(e runEntry) string {
	return base64.RawURLEncoding.EncodeToString([]byte(formatScore(e.score) + " " + e.member))
}

// decodeRunToken reads a page token of encodeRunToken; the empty token is
// the start (after false). It takes only what encodeRunToken writes.
func decodeRunToken(tok string) (runEntry, bool, bool) {
	if tok == "" {
		return runEntry{}, false, true
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(tok)
	if err != nil {
		return runEntry{}, false, false
	}
	score, member, found := strings.Cut(string(b), " ")
	f, err := strconv.ParseFloat(score, 64)
	if !found || err != nil || formatScore(f) != score || member == "" {
		return runEntry{}, false, false
	}
	id, err := decodeComponent(member)
	if err != nil || checkID("page_token", id, MaxRunIDLen, true) != nil {
		return runEntry{}, false, false
	}
	e := runEntry{score: f, member: member}
	if encodeRunToken(e) != tok {
		return runEntry{}, false, false
	}
	return e, true, true
}
