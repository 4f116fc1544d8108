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

// TestParsePoliciesRefusesNullKeys: decoding drops without a word every
// entry whose key YAML reads as null (null, Null, NULL, ~, a key left empty
// or tagged !!null, an alias of a null), under defaults, in a rule, at the
// top level or in a mapping merged into one (<<), in block and flow style:
// the file is refused naming the place and the key's line, never loaded
// without the entry.
func TestParsePoliciesRefusesNullKeys(t *testing.T) {
	for _, name := range []string{"null", "Null", "NULL", "~"} {
		for _, tc := range []struct{ doc, want string }{
			{"defaults:\n  lease: 30s\n  " + name + ": 5\n", "defaults: line 3"},
			{"defaults: {lease: 30s, " + name + ": 5}\n", "defaults: line 1"},
			{"tools:\n  - match: a\n    " + name + ": 1\n", "tools[0] (a): line 3"},
			{"tools: [{match: a}, {match: b, " + name + ": 1}]\n", "tools[1] (b): line 1"},
			{"defaults: {lease: 30s}\n" + name + ": 2\n", "the top level: line 2"},
			{name + ":\n  lease: 1s\n", "the top level: line 1"},
			{"defaults: {<<: {" + name + ": 5}, lease: 30s}\n", "defaults: line 1"},
			{"tools:\n  - match: a\n    <<: [{lease: 1s}, {" + name + ": 1}]\n", "tools[0] (a): line 3"},
			{"<<: {tools: [], " + name + ": 1}\n", "the top level: line 1"},
			{"tools:\n  - &r {match: a, " + name + ": 1}\n  - {<<: *r, match: b}\n", "tools[0] (a): line 2"},
			{"defaults: {effect: &n " + name + "}\ntools: [{match: a, *n : 1}]\n", "tools[0] (a): line 2"},
		} {
			_, err := ParsePolicies([]byte(tc.doc))
			want := tc.want + `: the key "` + name + `" reads as YAML's null`
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%q: %v, want an error with %q", tc.doc, err, want)
			}
		}
	}
	// A key left empty, or tagged as null, is null as well.
	for _, tc := range []struct{ doc, want string }{
		{"defaults: {lease: 30s, ? : 5}\n", "defaults: line 1: the key left empty reads as YAML's null"},
		{"tools:\n  - match: a\n    ? \n    : 1\n", "tools[0] (a): line 3: the key left empty reads as YAML's null"},
		{"tools: [{match: a, !!null '': 1}]\n", "tools[0] (a): line 1: the key left empty reads as YAML's null"},
		{"defaults: {}\n!!null : 1\n", "the top level: line 2: the key left empty reads as YAML's null"},
	} {
		if _, err := ParsePolicies([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
	// A null value is a field left unset, not a null key.
	p, err := ParsePolicies([]byte("defaults: {lease: ~, max_attempts: 3}\ntools: [{match: a, tenant: null}]\n"))
	if err != nil || p.For("t", "a").MaxAttempts != 3 || p.For("t", "a").Lease != DefaultPolicy.Lease {
		t.Errorf("null values: %v", err)
	}
}
