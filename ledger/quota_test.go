package ledger

import (
	"testing"
	"time"
)

// TestQuotaTalliesPruned: a tenant's tally unused for a minute is dropped
// (checked at most once a minute), so the tallies of tenants gone quiet do
// not pile up; one in use is kept, and so is one that holds a grant, whose
// Reserve may still create an operation.
func TestQuotaTalliesPruned(t *testing.T) {
	var q quotas
	t0 := time.Unix(1_800_000_000, 0)
	prev := map[string]*tally{}
	for _, name := range []string{"idle", "busy", "held"} {
		prev[name] = q.get(name, t0) // the first get prunes nothing, and starts the minute
	}
	prev["held"].begin(10, t0)
	for _, step := range []struct {
		at      time.Duration
		release bool            // held's grant is returned first
		dropped map[string]bool // the tenants whose tally is a new one
	}{
		{at: 30 * time.Second},
		{at: 61 * time.Second, dropped: map[string]bool{"idle": true}},
		{at: 95 * time.Second}, // pruned at 61s: not again before 121s
		{at: 125 * time.Second, dropped: map[string]bool{"idle": true}},
		{at: 190 * time.Second, release: true, dropped: map[string]bool{"idle": true, "held": true}},
	} {
		now := t0.Add(step.at)
		if step.release {
			prev["held"].end(false)
		}
		prev["busy"].begin(10, now)
		prev["busy"].end(false)
		for _, name := range []string{"idle", "busy", "held"} {
			got := q.get(name, now)
			if dropped := got != prev[name]; dropped != step.dropped[name] {
				t.Errorf("at %v: %s's tally dropped %v, want %v", step.at, name, dropped, step.dropped[name])
			}
			prev[name] = got
		}
	}
}
