package gogc

import (
	"runtime/debug"
	"testing"
)

// TestTune: Tune sets Percent unless GOGC is set.
func TestTune(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	for _, tc := range []struct {
		gogc string
		want int
	}{
		{"", Percent},
		{"50", 100},
		{"off", 100},
	} {
		debug.SetGCPercent(100)
		Tune(func(k string) string {
			if k == "GOGC" {
				return tc.gogc
			}
			return ""
		})
		if got := debug.SetGCPercent(100); got != tc.want {
			t.Errorf("GOGC %q: the GC target is %d, want %d", tc.gogc, got, tc.want)
		}
	}
}
