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

// TestListRunsStates: with states, only runs listed in them, in the same
// order, over pages of every size; a run past its deadline counts as
// ended by it; a token from another listing starts where the states'
// runs start, or ends the listing past them; unknown states are refused.
func TestListRunsStates(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		for _, id := range []string{"r-a", "r-b", "r-c", "r-d"} {
			e.startRun(t, id, RunLimits{})
			time.Sleep(2 * time.Millisecond) // distinct start times
		}
		for id, st := range map[string]RunState{"r-c": RunStateDone, "r-d": RunStateCancelled} {
			if _, err := e.l.EndRun(e.ctx, e.who, id, st, ""); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		e.startRun(t, "r-e", RunLimits{Deadline: 20 * time.Millisecond})
		time.Sleep(40 * time.Millisecond)
		// list pages through runs in states with pages of size, from tok.
		list := func(t *testing.T, size int, tok string, states ...RunState) []string {
			t.Helper()
			var got []string
			for pages := 0; ; pages++ {
				page, err := e.l.ListRuns(e.ctx, e.who, size, tok, states...)
				if err != nil {
					t.Fatalf("states %v, size %d: %v", states, size, err)
				}
				for _, r := range page.Runs {
					if len(states) > 0 && !slices.Contains(states, r.State) {
						t.Errorf("states %v: %s is %v", states, r.ID, r.State)
					}
					got = append(got, r.ID)
				}
				if tok = page.NextPageToken; tok == "" || pages > 20 {
					return got
				}
			}
		}
		ended := list(t, 50, "", RunStateDone, RunStateCancelled)
		for _, c := range []struct {
			states []RunState
			want   []string
		}{
			{nil, []string{"r-e", "r-b", "r-a", ended[0], ended[1]}},
			{[]RunState{RunStateRunning}, []string{"r-b", "r-a"}},
			{[]RunState{RunStateDeadline}, []string{"r-e"}},
			{[]RunState{RunStateDone}, []string{"r-c"}},
			{[]RunState{RunStateCancelled, RunStateDone}, ended},
			{[]RunState{RunStateRunning, RunStateCancelled}, []string{"r-b", "r-a", "r-d"}},
			{[]RunState{RunStateStepLimit, RunStateRepetition}, nil},
		} {
			for _, size := range []int{1, 2, 50} {
				if got := list(t, size, "", c.states...); !slices.Equal(got, c.want) {
					t.Errorf("states %v, pages of %d: %v, want %v", c.states, size, got, c.want)
				}
			}
		}
		if !slices.Contains(ended, "r-c") || !slices.Contains(ended, "r-d") || len(ended) != 2 {
			t.Fatalf("ended runs: %v", ended)
		}
		// A token among running runs, taken with ended states: from the
		// first ended run.
		first, err := e.l.ListRuns(e.ctx, e.who, 2, "")
		if err != nil || first.NextPageToken == "" {
			t.Fatalf("first page: %+v, %v", first, err)
		}
		if got := list(t, 50, first.NextPageToken, RunStateDone); !slices.Equal(got, []string{"r-c"}) {
			t.Errorf("DONE after a running run's token: %v", got)
		}
		// A token among ended runs, taken with the running state: nothing.
		last, err := e.l.ListRuns(e.ctx, e.who, 1, "", RunStateCancelled, RunStateDone)
		if err != nil || last.NextPageToken == "" {
			t.Fatalf("an ended page: %+v, %v", last, err)
		}
		if page, err := e.l.ListRuns(e.ctx, e.who, 50, last.NextPageToken, RunStateRunning); err != nil || len(page.Runs) != 0 || page.NextPageToken != "" {
			t.Errorf("RUNNING after an ended run's token: %+v, %v", page, err)
		}
		for _, st := range []RunState{RunStateUnspecified, RunStateCancelled + 1, 255} {
			_, err := e.l.ListRuns(e.ctx, e.who, 0, "", RunStateDone, st)
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
