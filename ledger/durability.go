package ledger

import (
	"context"
	"strings"
)

// DurabilityCheck is one Redis setting that decides whether acknowledged
// records survive a crash or memory pressure.
type DurabilityCheck struct {
	Name  string // appendonly, appendfsync, maxmemory-policy
	Value string // as Redis reports it; "" when it could not be read
	OK    bool
	Why   string // what is at risk when not OK
}

// CheckDurability reads the settings that decide whether records can be
// lost or evicted: appendonly (yes), appendfsync (always) and
// maxmemory-policy (noeviction). A setting that cannot be read (an ACL
// without +config|get, a store without CONFIG, Redis unreachable) is
// reported not OK, with why; the remedy +config|get is named only when the
// ACL refused CONFIG GET.
func (l *Ledger) CheckDurability(ctx context.Context) []DurabilityCheck {
	want := []struct{ name, ok, why string }{
		{"appendonly", "yes", "without the append-only file a crash loses every record written since the last snapshot"},
		{"appendfsync", "always", "a crash can lose the acknowledged writes of the last second (everysec) or more (no)"},
		{"maxmemory-policy", "noeviction", "under memory pressure Redis may evict records, which then no longer protect their operations"},
	}
	out := make([]DurabilityCheck, 0, len(want))
	for _, w := range want {
		c := DurabilityCheck{Name: w.name}
		vals, err := l.rdb.ConfigGet(ctx, w.name).Result()
		switch {
		case err != nil:
			c.Why = "cannot be read (" + strings.SplitN(err.Error(), "\n", 2)[0] + ")"
			if msg := err.Error(); strings.Contains(msg, "NOPERM") && strings.Contains(msg, "'config") {
				// Refused by the ACL, not lost on the way (Redis gone, a
				// cluster user without +cluster|slots).
				c.Why += "; grant +config|get to check it"
			}
		case vals[w.name] == "":
			c.Why = "not reported by the store"
		default:
			c.Value = vals[w.name]
			c.OK = strings.EqualFold(c.Value, w.ok)
			if !c.OK {
				c.Why = w.why
			}
		}
		out = append(out, c)
	}
	return out
}
