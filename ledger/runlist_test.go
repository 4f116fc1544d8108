package ledger

import (
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestListRuns: running runs first, newest first, then ended ones, latest
// ended first, over pages of every size, with no run twice or left out; a
// run past its deadline is listed as ended by it; bad tokens are refused.
func TestListRuns(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		var running, ended []string
		for i := range 12 {
			id := "run-" + itoa(int64(i))
			e.startRun(t, id, RunLimits{})
			running = append(running, id)
			time.Sleep(2 * time.Millisecond) // distinct start times
		}
		for _, id := range []string{"run-3", "run-7", "run-0"} {
			if _, err := e.l.EndRun(e.ctx, e.who, id, RunStateDone, ""); err != nil {
				t.Fatal(err)
			}
			running = slices.DeleteFunc(running, func(s string) bool { return s == id })
			ended = append([]string{id}, ended...)
			time.Sleep(2 * time.Millisecond)
		}
		slices.Reverse(running)
		want := append(running, ended...)
		for _, size := range []int{1, 2, 5, 15, 50} {
			var got []string
			tok := ""
			for pages := 0; ; pages++ {
				page, err := e.l.ListRuns(e.ctx, e.who, size, tok)
				if err != nil {
					t.Fatalf("size %d: %v", size, err)
				}
				for _, r := range page.Runs {
					got = append(got, r.ID)
				}
				if tok = page.NextPageToken; tok == "" || pages > 20 {
					break
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("pages of %d: %v, want %v", size, got, want)
			}
		}
		e.startRun(t, "lapsed", RunLimits{Deadline: 20 * time.Millisecond})
		time.Sleep(40 * time.Millisecond)
		page, err := e.l.ListRuns(e.ctx, e.who, 1, "")
		if err != nil || len(page.Runs) != 1 || page.Runs[0].ID != "lapsed" || page.Runs[0].State != RunStateDeadline {
			t.Fatalf("the run past its deadline: %+v, %v", page, err)
		}
		// A run whose record expired is left out, and its index entry goes.
		k := e.l.keys.run(e.who.Tenant, "lapsed")
		if err := e.rdb.Del(e.ctx, k.all[0]).Err(); err != nil {
			t.Fatal(err)
		}
		if page, err := e.l.ListRuns(e.ctx, e.who, 1, ""); err != nil || len(page.Runs) != 0 || page.NextPageToken == "" {
			t.Fatalf("a page of only an expired run: %+v, %v; want it empty, with more to come", page, err)
		}
		if n, err := e.rdb.ZScore(e.ctx, k.all[1], k.member).Result(); err != redis.Nil {
			t.Fatalf("the expired run's index entry: %v, %v; want it removed", n, err)
		}
		other := *e
		other.who.Tenant += "-other"
		if page, err := other.l.ListRuns(e.ctx, other.who, 0, ""); err != nil || len(page.Runs) != 0 {
			t.Fatalf("another tenant's runs: %+v, %v", page, err)
		}
		for _, c := range []struct {
			size int
			tok  string
		}{{-1, ""}, {MaxRunPageSize + 1, ""}, {0, "x"}, {0, encodeRunToken(runEntry{score: 1.5, member: "a%"})}, {0, "LTEgYQ=="}} {
			_, err := e.l.ListRuns(e.ctx, e.who, c.size, c.tok)
			wantKind(t, err, KindInvalid)
		}
	})
}

// FuzzRunPageToken: decodeRunToken takes back exactly what encodeRunToken
// writes.
func FuzzRunPageToken(f *testing.F) {
	f.Add(encodeRunToken(runEntry{score: -1796173039360, member: "run-1"}))
	f.Add(encodeRunToken(runEntry{score: 1125899906842624 - 1796173039360, member: "r%3A1"}))
	f.Add("")
	f.Add("LTEgYQ")
	f.Fuzz(func(t *testing.T, tok string) {
		e, after, ok := decodeRunToken(tok)
		if !ok || !after {
			return
		}
		if encodeRunToken(e) != tok {
			t.Fatalf("%q decodes to %+v, which encodes to %q", tok, e, encodeRunToken(e))
		}
	})
}
