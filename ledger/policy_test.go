package ledger

import (
	"strings"
	"testing"
	"time"
)

func TestGlobMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"*", "", true},
		{"*", "org/team", true},
		{"payments.*", "payments.refund", true},
		{"payments.*", "payments/refund", false},
		{"payments*", "payments/refund", true},
		{"payments.*", "payment.refund", false},
		{"*.refund", "payments.refund", true},
		{"a?c", "abc", true},
		{"a?c", "ac", false},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{"[x]", "[x]", true},
		{"tickets.create", "tickets.create", true},
		{"é*", "ééé", true},
		{"*", "*0", true},
		{"acme-*", "acme-*eu", true},
		{"a*", "a*", true},
	} {
		if got := match(c.pattern, c.s); got != c.want {
			t.Errorf("match(%q, %q) = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}

func TestParsePolicies(t *testing.T) {
	p, err := ParsePolicies([]byte(`
defaults:
  lease: 45s
  max_attempts: 4
tools:
  - match: "payments.*"
    tenant: "acme*"
    effect: EFFECT_IDEMPOTENT
    retention: 720h
    consequential_fields: ["/amount", "/currency"]
  - match: "payments.*"
    lease: 2m
  - match: "search_*"
    effect: read_only
`))
	if err != nil {
		t.Fatal(err)
	}
	acme := p.For("acme/eu", "payments.refund")
	if acme.Effect != EffectIdempotent || acme.Lease != 45*time.Second || acme.MaxAttempts != 4 || acme.Retention != 720*time.Hour || len(acme.ConsequentialFields) != 2 {
		t.Fatalf("acme policy = %+v", acme)
	}
	other := p.For("globex", "payments.refund")
	if other.Effect != EffectIrreversible || other.Lease != 2*time.Minute || other.ConsequentialFields != nil {
		t.Fatalf("globex policy = %+v", other)
	}
	if s := p.For("acme", "search_orders"); s.Effect != EffectReadOnly || s.TombstoneRetention != DefaultPolicy.TombstoneRetention {
		t.Fatalf("search policy = %+v", s)
	}
	if d := p.For("acme", "tickets.create"); d.Lease != 45*time.Second || d.Effect != EffectIrreversible {
		t.Fatalf("default policy = %+v", d)
	}
	empty, err := ParsePolicies(nil)
	if err != nil || empty.For("t", "x").Lease != DefaultPolicy.Lease {
		t.Fatalf("empty file: %v", err)
	}
}

func TestParsePoliciesRefusesBadFiles(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"defaults:\n  lease: soon\n", "lease"},
		{"defaults:\n  lease: 1ns\n", "lease"},
		{"defaults:\n  max_attempts: 0\n", "max_attempts"},
		{"defaults:\n  max_attempts: 2.5\n", "max_attempts"},
		{"defaults:\n  effect: sometimes\n", "effect"},
		{"defaults:\n  effect: ıdempotent\n", "effect"},
		{"defaults:\n  effect: irreverſible\n", "effect"},
		{"defaults:\n  leese: 1s\n", "leese"},
		{"tools:\n  - lease: 1s\n", "match is required"},
		{"tools:\n  - match: x\n    consequential_fields: [\"amount\"]\n", "consequential_fields"},
		{"defaults: {}\n---\ndefaults: {lease: 1s}\n", "exactly one"},
		{"tools: 3\n", "cannot unmarshal"},
	} {
		_, err := ParsePolicies([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error about %q", c.doc, err, c.want)
		}
	}
}
