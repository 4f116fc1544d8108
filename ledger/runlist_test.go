package ledger

import (
	"slices"
	"testing"
	"time"
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
		other := *e
		other.who.Tenant += "-other"
		if page, err := other.l.ListRuns(e.ctx, other.who, 0, ""); err != nil || len(page.Runs) != 0 {
			t.Fatalf("another tenant's runs: %+v, %v", page, err)
		}
		for _, c := range []struct {
			size int
			tok  string
		}{{-1, ""}, {MaxRunPageSize + 1, ""}, {0, "x"}, {0, encodeRunToken(runEntry{1.5, "a%"})}, {0, "LTEgYQ=="}} {
			_, err := e.l.ListRuns(e.ctx, e.who, c.size, c.tok)
			wantKind(t, err, KindInvalid)
		}
	})
}

// FuzzRunPageToken: decodeRunToken takes back exactly what encodeRunToken
// writes.
func FuzzRunPageToken(f *testing.F) {
	f.Add(encodeRunToken(runEntry{-1796173039360, "run-1"}))
	f.Add(encodeRunToken(runEntry{1125899906842624 - 1796173039360, "r%3A1"}))
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
