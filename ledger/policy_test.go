package ledger

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/yamlnull/yamlnulltest"
	"go.yaml.in/yaml/v3"
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
		{"defaults:\n  lease: soon\n", `lease "soon": want a duration such as 90s`},
		{"tools:\n  - match: pay.*\n    retention: 7d\n", `tools[0] (pay.*): retention "7d": want a duration such as 90s, 10m or 168h (units: ms, s, m, h; no d)`},
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
		{"tools: 3\n", "line 1: tools: a whole number where a list belongs"},
		{"tools:\n  - match: x\n    efect: irreversible\n", "line 3: unknown field efect"},
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

// policyExample is the complete example policy of docs/configuration.md
// (section 7).
const policyExample = `# ledgerd policy file (YAML; JSON is accepted too).
defaults:
  effect: irreversible
  lease: 30s
  max_attempts: 5
  retention: 168h
  retain_grace: 24h
  recovery_window: 15m
  tombstone_retention: 720h
tools:
  - match: "payments.refund"
    tenant: "acme-*"
    lease: 60s
    max_attempts: 3
    retention: 2160h
    consequential_fields: ["/amount", "/currency", "/charge_id"]
  - match: "payments.*"
    lease: 45s
    consequential_fields: ["/amount", "/currency", "/account_id"]
  - match: "calendar.create_appointment"
    lease: 20s
    retain_grace: 168h
    consequential_fields: ["/patient_id", "/slot/start", "/slot/provider_id"]
`

// FuzzParsePolicies: a policy file either parses into policies whose every
// value lies within the documented bounds, or is refused with a message;
// For resolves to the first rule both patterns match (by an independent
// matcher), else to the defaults; and the parsed policies, written back as
// a file, parse to the same policies. An accepted file has no mapping key
// that YAML reads as null (whose entry decoding would drop).
func FuzzParsePolicies(f *testing.F) {
	for _, doc := range []string{
		policyExample,
		ledgertest.Policy,
		"",
		"# only a comment\n",
		`{"defaults": {"lease": "1.5s", "effect": "EFFECT_IDEMPOTENT"}, "tools": [{"match": "crm*", "tenant": "acme-?"}]}`,
		"defaults:\n  lease: 7d\n",
		"defaults:\n  lease: 30\n",
		"defaults:\n  lease: 5ms\n",
		"defaults:\n  retain_grace: 0s\n  recovery_window: 1ms\n  tombstone_retention: 87600h\n",
		"defaults:\n  max_attempts: 1000\n",
		"defaults:\n  max_attempts: 1001\n",
		"defaults:\n  effect: Read_Only\n",
		"defaults:\n  consequential_fields: [\"\", \"/a~1b/m~0n/0\"]\n",
		"tools:\n  - match: x\n    consequential_fields: []\n",
		"tools:\n  - match: x\n    consequential_fields: [\"/a~2\"]\n",
		"defaults: {}\n---\ndefaults: {lease: 1s}\n",
		"tools:\n  - lease: 1s\n",
		"defaults: &d {lease: 1s}\ntools: [{match: a, <<: *d}]\n",
		"defaults: {lease: 30s, ~: 5}\n",
		"defaults:\n  lease: 30s\n  NULL: 5\n",
		"tools: [{match: a, null: 1}]\n",
		"tools:\n  - match: a\n    Null: 1\n",
		"defaults: {}\n~: 2\n",
		"tools:\n  - {match: a, <<: [{lease: 1s}, {? : 1}]}\n",
		"defaults: {effect: &n ~}\ntools: [{match: a, *n : 1, !!null '': 2}]\n",
		"defaults: {lease: ~, max_attempts: null}\ntools: [{match: a, tenant: ~}]\n",
		"runs:\n  - {max_steps: 1.5}\n",
		"runs:\n  - {implicit: true, max_steps: 3}\n",
		"runs:\n  - {tenant: a*, deadline: 721h}\n",
		"tools:\n  - {match: a, run_max_repeats: 0}\n",
	} {
		f.Add([]byte(doc), "acme-eu", "payments.refund")
	}
	f.Fuzz(func(t *testing.T, data []byte, tenant, tool string) {
		p, err := ParsePolicies(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("refused with an empty message")
			}
			return
		}
		if line, ok := yamlnulltest.NullMappingKey(data); ok {
			t.Fatalf("accepted a file whose key on line %d reads as YAML's null (its entry dropped)", line)
		}
		checkPolicy(t, "defaults", p.defaults)
		for i, r := range p.rules {
			if r.tool == "" || r.tenant == "" {
				t.Fatalf("rule %d: empty pattern (%q, %q)", i, r.tool, r.tenant)
			}
			checkPolicy(t, r.tool, r.policy)
		}
		for i, r := range p.runs {
			l := r.policy.Limits
			if r.tenant == "" || l.MaxSteps < 0 || l.MaxSteps > MaxRunCount || l.MaxRepeats < 0 || l.MaxRepeats > MaxRunCount ||
				l.MaxIrreversible < 0 || l.MaxIrreversible > MaxRunCount || l.Deadline < 0 || l.Deadline > MaxRunDeadline ||
				(r.policy.Implicit && l.Deadline == 0) || r.policy.Retention < time.Second {
				t.Fatalf("runs[%d]: %+v", i, r)
			}
		}
		want := p.defaults
		for _, r := range p.rules {
			if globMatch(r.tool, tool) && globMatch(r.tenant, tenant) {
				want = r.policy
				break
			}
		}
		if got := p.For(tenant, tool); !reflect.DeepEqual(got, want) {
			t.Fatalf("For(%q, %q) = %+v, want %+v", tenant, tool, got, want)
		}
		again, err := ParsePolicies(writePolicies(t, p))
		if err != nil {
			t.Fatalf("the parsed policies written back do not parse: %v", err)
		}
		if !reflect.DeepEqual(again, p) {
			t.Fatalf("written back and parsed again: %+v, want %+v", again, p)
		}
	})
}

// checkPolicy fails t unless every value of pol is within the bounds
// docs/configuration.md (section 6.2) gives.
func checkPolicy(t *testing.T, where string, pol Policy) {
	t.Helper()
	if pol.Effect != EffectReadOnly && pol.Effect != EffectIdempotent && pol.Effect != EffectIrreversible {
		t.Fatalf("%s: effect %v", where, pol.Effect)
	}
	for _, d := range []struct {
		name     string
		v        time.Duration
		min, max time.Duration
	}{
		{"lease", pol.Lease, 10 * time.Millisecond, 24 * time.Hour},
		{"retention", pol.Retention, time.Second, 87600 * time.Hour},
		{"retain_grace", pol.RetainGrace, 0, 87600 * time.Hour},
		{"recovery_window", pol.RecoveryWindow, time.Millisecond, 87600 * time.Hour},
		{"tombstone_retention", pol.TombstoneRetention, time.Second, 87600 * time.Hour},
	} {
		if d.v < d.min || d.v > d.max {
			t.Fatalf("%s: %s %s, want %s to %s", where, d.name, d.v, d.min, d.max)
		}
	}
	if pol.MaxAttempts < 1 || pol.MaxAttempts > 1000 {
		t.Fatalf("%s: max_attempts %d", where, pol.MaxAttempts)
	}
	if pol.RunMaxRepeats < 0 || pol.RunMaxRepeats > MaxRunCount {
		t.Fatalf("%s: run_max_repeats %d", where, pol.RunMaxRepeats)
	}
	for _, ptr := range pol.ConsequentialFields {
		if err := fingerprint.ValidatePointer(ptr); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
	}
}

// writePolicies writes p as a policy file (in JSON), every field explicit.
func writePolicies(t *testing.T, p *Policies) []byte {
	t.Helper()
	fields := func(pol Policy) map[string]any {
		cf := pol.ConsequentialFields
		if cf == nil {
			cf = []string{}
		}
		m := map[string]any{
			"effect":               strings.ToLower(pol.Effect.String()),
			"lease":                pol.Lease.String(),
			"max_attempts":         pol.MaxAttempts,
			"retention":            pol.Retention.String(),
			"retain_grace":         pol.RetainGrace.String(),
			"recovery_window":      pol.RecoveryWindow.String(),
			"tombstone_retention":  pol.TombstoneRetention.String(),
			"consequential_fields": cf,
		}
		if pol.RunMaxRepeats > 0 {
			m["run_max_repeats"] = pol.RunMaxRepeats
		}
		return m
	}
	tools := []map[string]any{}
	for _, r := range p.rules {
		m := fields(r.policy)
		m["match"], m["tenant"] = r.tool, r.tenant
		tools = append(tools, m)
	}
	runs := []map[string]any{}
	for _, r := range p.runs {
		m := map[string]any{"tenant": r.tenant, "retention": r.policy.Retention.String(), "implicit": r.policy.Implicit}
		for name, n := range map[string]int{"max_steps": r.policy.Limits.MaxSteps, "max_repeats": r.policy.Limits.MaxRepeats,
			"max_irreversible": r.policy.Limits.MaxIrreversible} {
			if n > 0 {
				m[name] = n
			}
		}
		if r.policy.Limits.Deadline > 0 {
			m["deadline"] = r.policy.Limits.Deadline.String()
		}
		runs = append(runs, m)
	}
	b, err := json.Marshal(map[string]any{"defaults": fields(p.defaults), "tools": tools, "runs": runs})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// globMatch is match written another way: by recursion over the runes.
func globMatch(pattern, s string) bool {
	p, n := []rune(pattern), []rune(s)
	memo := map[[2]int]bool{}
	var m func(i, j int) bool
	m = func(i, j int) bool {
		if v, ok := memo[[2]int{i, j}]; ok {
			return v
		}
		var v bool
		switch {
		case i == len(p):
			v = j == len(n)
		case p[i] == '*':
			v = m(i+1, j) || j < len(n) && m(i, j+1)
		default:
			v = j < len(n) && (p[i] == '?' || p[i] == n[j]) && m(i+1, j+1)
		}
		memo[[2]int{i, j}] = v
		return v
	}
	return m(0, 0)
}

// FuzzGlobMatch: match agrees with an independent matcher, a pattern
// without '*' and '?' matches exactly itself, and "*" matches everything.
func FuzzGlobMatch(f *testing.F) {
	for _, c := range [][2]string{
		{"payments.*", "payments.refund"}, {"payments.*", "payments/refund"}, {"crm*", "crm/contacts"},
		{"acme-*", "acme-eu"}, {"a?c", "abc"}, {"a*b*c", "axxbyy"}, {"*.refund", "payments.refund"},
		{"[x]", "[x]"}, {"é*", "ééé"}, {"?", "é"}, {"**", ""}, {"*?*", ""}, {"\xff", "\xfe"},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, pattern, s string) {
		if len(pattern) > 64 || len(s) > 256 {
			return // the reference is quadratic
		}
		got := match(pattern, s)
		if want := globMatch(pattern, s); got != want {
			t.Fatalf("match(%q, %q) = %v, want %v", pattern, s, got, want)
		}
		if !strings.ContainsAny(pattern, "*?") && utf8.ValidString(pattern) && utf8.ValidString(s) && got != (pattern == s) {
			t.Fatalf("match(%q, %q) = %v without wildcards", pattern, s, got)
		}
		if !match("*", s) {
			t.Fatalf("\"*\" does not match %q", s)
		}
	})
}

// FuzzPolicyValue: any string given to any field of a policy is either
// refused with an error that names the field, or accepted only in the
// documented syntax: an effect by its name (ASCII letters in any case, with
// or without "EFFECT_"), a duration in Go syntax within the field's bounds,
// max_attempts as a YAML number whose value is a whole number from 1 to
// 1000.
func FuzzPolicyValue(f *testing.F) {
	for _, s := range []string{"30s", "1.5s", "1h30m", "168h", "7d", "30", "0s", "-1s", "10ms", "9ms", "24h", "24h0m0.001s",
		"87600h", "87601h", "irreversible", "EFFECT_IDEMPOTENT", "Read_Only", "effect_read_only", "sometimes", "5", "0", "1e3", "0x10", "1_000", "~", "\t", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		quoted, err := json.Marshal(value)
		if err != nil || !utf8.ValidString(value) {
			return // a YAML file is text
		}
		for _, field := range []string{"effect", "lease", "retention", "retain_grace", "recovery_window", "tombstone_retention", "max_attempts"} {
			raw := string(quoted)
			if field == "max_attempts" {
				raw = value // a number, unquoted
				if strings.ContainsAny(value, "\n\r#:{}[],&*!|>'\"%@`") {
					continue
				}
			}
			p, err := ParsePolicies([]byte("defaults:\n  " + field + ": " + raw + "\n"))
			if err != nil {
				if !strings.Contains(err.Error(), field) && !strings.HasPrefix(err.Error(), "yaml: ") {
					t.Fatalf("%s %q refused with %q, which does not name the field", field, value, err)
				}
				continue
			}
			if value == "" {
				continue // unset: the built-in default
			}
			checkPolicy(t, field, p.defaults)
			switch field {
			case "effect":
				name := asciiLower(strings.TrimPrefix(asciiLower(value), "effect_"))
				if name != "read_only" && name != "idempotent" && name != "irreversible" {
					t.Fatalf("effect %q accepted as %v", value, p.defaults.Effect)
				}
			case "max_attempts":
				// Any YAML spelling of the number (1000, 1e3, 0x3e8).
				// Read in the same place; a null (~, or only blanks) leaves
				// it unset.
				var doc struct{ N *float64 }
				err := yaml.Unmarshal([]byte("n: "+raw+"\n"), &doc)
				n := doc.N
				if err != nil || n == nil && p.defaults.MaxAttempts != DefaultPolicy.MaxAttempts || n != nil && *n != float64(p.defaults.MaxAttempts) {
					t.Fatalf("max_attempts %q accepted as %d", value, p.defaults.MaxAttempts)
				}
			default:
				if _, err := time.ParseDuration(value); err != nil {
					t.Fatalf("%s %q accepted", field, value)
				}
			}
		}
	})
}
