package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/internal/yamlerr"
	"github.com/opledger/ledger/internal/yamlnull"
	"go.yaml.in/yaml/v3"
)

// Policy is how the ledger treats the operations of one tool (for one
// tenant). It is bound to an operation when the operation is created: a
// changed policy applies to new operations only.
type Policy struct {
	// Effect is the default effect when Reserve leaves it unspecified.
	Effect Effect
	// Lease is how long a claim stays valid without Renew.
	Lease time.Duration
	// MaxAttempts bounds the claims of one operation.
	MaxAttempts int
	// Retention is how long a terminal record is kept.
	Retention time.Duration
	// RetainGrace is added to a request's retain_until: a terminal record
	// lives for max(Retention, retain_until + RetainGrace).
	RetainGrace time.Duration
	// RecoveryWindow is how long an operation may stay UNKNOWN before it is
	// overdue (an alert).
	RecoveryWindow time.Duration
	// TombstoneRetention is how long the tombstone outlives the record, so a
	// late replay is reported as IDEMPOTENCY_KEY_EXPIRED.
	TombstoneRetention time.Duration
	// ConsequentialFields are the JSON pointers (RFC 6901) of the parameters
	// that are fingerprinted; empty means all of them.
	ConsequentialFields []string
	// RunMaxRepeats bounds the steps of one run calling this tool with one
	// fingerprint (0: the run's limit alone).
	RunMaxRepeats int
}

// DefaultPolicy is the policy of every tool no rule matches, unless the
// policy file's defaults say otherwise.
var DefaultPolicy = Policy{
	Effect:             EffectIrreversible,
	Lease:              30 * time.Second,
	MaxAttempts:        5,
	Retention:          7 * 24 * time.Hour,
	RetainGrace:        24 * time.Hour,
	RecoveryWindow:     15 * time.Minute,
	TombstoneRetention: 30 * 24 * time.Hour,
}

// Limits on policy values, checked when a file is loaded.
const (
	minLease       = 10 * time.Millisecond
	maxLease       = 24 * time.Hour
	maxMaxAttempts = 1000
	minRetention   = time.Second
	maxRetention   = 10 * 365 * 24 * time.Hour
)

// Policies resolves the policy of a tenant's tool: the first rule whose tool
// and tenant patterns both match, on top of the defaults.
type Policies struct {
	defaults Policy
	rules    []policyRule
	runs     []runRule
}

type runRule struct {
	tenant string // glob pattern
	policy RunPolicy
}

type policyRule struct {
	tool, tenant string // glob patterns (see match)
	policy       Policy
}

// DefaultPolicies returns policies with DefaultPolicy for every tool.
func DefaultPolicies() *Policies { return &Policies{defaults: DefaultPolicy} }

// For returns the policy of tenant's tool.
func (p *Policies) For(tenant, tool string) Policy {
	for _, r := range p.rules {
		if match(r.tool, tool) && match(r.tenant, tenant) {
			return r.policy
		}
	}
	return p.defaults
}

// RunFor returns the run policy of tenant: the first runs rule whose
// tenant pattern matches, or DefaultRunPolicy.
func (p *Policies) RunFor(tenant string) RunPolicy {
	for _, r := range p.runs {
		if match(r.tenant, tenant) {
			return r.policy
		}
	}
	return DefaultRunPolicy
}

// MatchGlob reports whether s matches the glob pattern as a policy rule's
// match does: '*' matches any run of characters, '?' any one character.
func MatchGlob(pattern, s string) bool { return match(pattern, s) }

// match reports whether s matches the glob pattern: '*' matches any run of
// characters ('/' and '.' included), '?' any one character, and every other
// character itself.
func match(pattern, s string) bool {
	p, n := []rune(pattern), []rune(s)
	pi, ni := 0, 0
	star, mark := -1, 0 // the last '*' seen, and where its match ends so far
	for ni < len(n) {
		switch {
		case pi < len(p) && p[pi] == '*':
			// Before the literal case: a '*' in the pattern is a wildcard
			// also where s holds a '*' (a tenant name may).
			star, mark = pi, ni
			pi++
		case pi < len(p) && (p[pi] == '?' || p[pi] == n[ni]):
			pi++
			ni++
		case star >= 0:
			mark++
			pi, ni = star+1, mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// The policy file, in YAML (JSON is YAML too). See docs/configuration.md.
type policyFile struct {
	Defaults policyFields  `yaml:"defaults"`
	Tools    []policyRuleY `yaml:"tools"`
	Runs     []runRuleY    `yaml:"runs"`
}

type runRuleY struct {
	Tenant          string       `yaml:"tenant"`
	MaxSteps        *wholeNumber `yaml:"max_steps"`
	Deadline        string       `yaml:"deadline"`
	MaxRepeats      *wholeNumber `yaml:"max_repeats"`
	MaxIrreversible *wholeNumber `yaml:"max_irreversible"`
	Retention       string       `yaml:"retention"`
	Implicit        bool         `yaml:"implicit"`
}

type policyRuleY struct {
	Match        string `yaml:"match"`
	Tenant       string `yaml:"tenant"`
	policyFields `yaml:",inline"`
}

type policyFields struct {
	Effect              string       `yaml:"effect"`
	Lease               string       `yaml:"lease"`
	MaxAttempts         *wholeNumber `yaml:"max_attempts"`
	Retention           string       `yaml:"retention"`
	RetainGrace         string       `yaml:"retain_grace"`
	RecoveryWindow      string       `yaml:"recovery_window"`
	TombstoneRetention  string       `yaml:"tombstone_retention"`
	ConsequentialFields []string     `yaml:"consequential_fields"`
	RunMaxRepeats       *wholeNumber `yaml:"run_max_repeats"`
}

// LoadPolicies reads a policy file.
func LoadPolicies(file string) (*Policies, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("policy file: %w", err)
	}
	p, err := ParsePolicies(data)
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", file, err)
	}
	return p, nil
}

// ParsePolicies parses a policy document:
//
//	defaults:                    # every field optional; DefaultPolicy otherwise
//	  effect: irreversible       # read_only | idempotent | irreversible
//	  lease: 30s                 # Go durations: 500ms, 30s, 15m, 168h
//	  max_attempts: 5
//	  retention: 168h
//	  retain_grace: 24h
//	  recovery_window: 15m
//	  tombstone_retention: 720h
//	tools:                       # first match wins
//	  - match: "payments.*"      # glob on the tool: * any run, ? one character
//	    tenant: "*"              # optional glob on the tenant
//	    lease: 60s               # unset fields inherit the defaults
//	    consequential_fields: ["/amount", "/currency", "/account_id"]
//	    run_max_repeats: 1       # steps of one run with the same parameters
//	runs:                        # first match on the tenant wins
//	  - tenant: "*"              # optional glob
//	    max_steps: 50            # defaults, and the most a StartRun may ask
//	    deadline: 15m
//	    max_repeats: 2
//	    max_irreversible: 10
//	    retention: 168h          # kept after the end (RunRetention)
//	    implicit: true           # govern run ids never started (needs a deadline)
//
// Unknown fields, out-of-range values, a mapping key YAML reads as null
// (null, Null, NULL, ~, a key left empty; its entry decoding would drop) and
// a second YAML document are errors.
func ParsePolicies(data []byte) (*Policies, error) {
	var f policyFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	// An empty document (io.EOF) means all defaults.
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlerr.Readable(err, data)
	}
	var more any
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, errors.New("the policy file must hold exactly one YAML document")
	}
	if err := refuseNullKeys(data, f.Tools); err != nil {
		return nil, err
	}
	defaults, err := f.Defaults.apply(DefaultPolicy)
	if err != nil {
		return nil, fmt.Errorf("defaults: %w", err)
	}
	p := &Policies{defaults: defaults}
	for i, r := range f.Tools {
		where := fmt.Sprintf("tools[%d]", i)
		if r.Match == "" {
			return nil, fmt.Errorf("%s: match is required", where)
		}
		if r.Tenant == "" {
			r.Tenant = "*"
		}
		pol, err := r.apply(defaults)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", where, r.Match, err)
		}
		p.rules = append(p.rules, policyRule{tool: r.Match, tenant: r.Tenant, policy: pol})
	}
	for i, r := range f.Runs {
		if r.Tenant == "" {
			r.Tenant = "*"
		}
		pol, err := r.apply()
		if err != nil {
			return nil, fmt.Errorf("runs[%d] (%s): %w", i, r.Tenant, err)
		}
		p.runs = append(p.runs, runRule{tenant: r.Tenant, policy: pol})
	}
	return p, nil
}

// apply returns the run policy the rule describes.
func (r runRuleY) apply() (RunPolicy, error) {
	p := DefaultRunPolicy
	counts := []struct {
		name string
		val  *wholeNumber
		dst  *int
	}{
		{"max_steps", r.MaxSteps, &p.Limits.MaxSteps},
		{"max_repeats", r.MaxRepeats, &p.Limits.MaxRepeats},
		{"max_irreversible", r.MaxIrreversible, &p.Limits.MaxIrreversible},
	}
	for _, c := range counts {
		if c.val == nil {
			continue
		}
		n, err := runCount(c.name, float64(*c.val))
		if err != nil {
			return p, err
		}
		*c.dst = n
	}
	if err := setDurations([]durationField{
		{"deadline", r.Deadline, &p.Limits.Deadline, time.Millisecond, MaxRunDeadline},
		{"retention", r.Retention, &p.Retention, minRetention, maxRetention},
	}); err != nil {
		return p, err
	}
	if r.Implicit && p.Limits.Deadline == 0 {
		return p, errors.New("implicit: a run nobody starts is never ended either, so it needs a deadline")
	}
	p.Implicit = r.Implicit
	return p, nil
}

// durationField is a duration of the policy file, with its bounds.
type durationField struct {
	name     string
	val      string
	dst      *time.Duration
	min, max time.Duration
}

// durationWanted says what a duration of the policy file is written as.
const durationWanted = "want a duration such as 90s, 10m or 168h (units: ms, s, m, h; no d)"

// setDurations parses each field that is set into its dst, and refuses one
// that does not parse or is out of its bounds.
func setDurations(fields []durationField) error {
	for _, d := range fields {
		if d.val == "" {
			continue
		}
		v, err := time.ParseDuration(d.val)
		if err != nil {
			return fmt.Errorf("%s %q: %s", d.name, d.val, durationWanted)
		}
		if v < d.min || v > d.max {
			return fmt.Errorf("%s %s: want between %s and %s", d.name, v, d.min, d.max)
		}
		*d.dst = v
	}
	return nil
}

// runCount checks a run limit from the policy file: a whole number from 1
// to MaxRunCount.
func runCount(name string, n float64) (int, error) {
	if n != math.Trunc(n) || n < 1 || n > MaxRunCount {
		return 0, fmt.Errorf("%s %v: want a whole number from 1 to %d", name, n, MaxRunCount)
	}
	return int(n), nil
}

// refuseNullKeys returns an error naming the first mapping key in the
// policy document data (decoded already, its rules tools) that YAML reads
// as null (yamlnull.Find), and nil when there is none: decoding drops such
// a key's entry without a word, under defaults, in a rule or at the top
// level, and the file would be loaded without it. The place is named as
// the other errors name it ("defaults", "tools[2] (payments.*)").
func refuseNullKeys(data []byte, tools []policyRuleY) error {
	k, ok := yamlnull.Find(data, nil)
	if !ok {
		return nil
	}
	where := k.Place
	var i int
	if _, err := fmt.Sscanf(k.Place, "tools[%d]", &i); err == nil && k.Place == fmt.Sprintf("tools[%d]", i) && i < len(tools) && tools[i].Match != "" {
		where = fmt.Sprintf("%s (%s)", k.Place, tools[i].Match)
	}
	if where == "" {
		where = "the top level"
	}
	return fmt.Errorf("%s: line %d: the key %s reads as YAML's null, and its entry would be dropped unread: write the field's name, or remove the entry", where, k.Line, k.Written())
}

// asciiLower lowers the ASCII letters of s, and only those.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// wholeNumber is a count in the policy file: any YAML number (5, 5.0, 0x5),
// checked to be whole where it is applied. Decoding it straight into an int
// would cut a fraction off (1.5 would read as 1).
type wholeNumber float64

// UnmarshalYAML reads a YAML number.
func (w *wholeNumber) UnmarshalYAML(n *yaml.Node) error {
	var f float64
	if err := n.Decode(&f); err != nil {
		return err
	}
	*w = wholeNumber(f)
	return nil
}

func (f policyFields) apply(base Policy) (Policy, error) {
	p := base
	p.ConsequentialFields = append([]string(nil), base.ConsequentialFields...)
	if f.Effect != "" {
		// Only ASCII letters are folded: strings.ToUpper would read the
		// dotless ı as I and the long ſ as S, taking "ıdempotent".
		switch strings.TrimPrefix(asciiLower(f.Effect), "effect_") {
		case "read_only":
			p.Effect = EffectReadOnly
		case "idempotent":
			p.Effect = EffectIdempotent
		case "irreversible":
			p.Effect = EffectIrreversible
		default:
			return p, fmt.Errorf("effect %q: want read_only, idempotent or irreversible", f.Effect)
		}
	}
	if err := setDurations([]durationField{
		{"lease", f.Lease, &p.Lease, minLease, maxLease},
		{"retention", f.Retention, &p.Retention, minRetention, maxRetention},
		{"retain_grace", f.RetainGrace, &p.RetainGrace, 0, maxRetention},
		{"recovery_window", f.RecoveryWindow, &p.RecoveryWindow, time.Millisecond, maxRetention},
		{"tombstone_retention", f.TombstoneRetention, &p.TombstoneRetention, minRetention, maxRetention},
	}); err != nil {
		return p, err
	}
	if f.MaxAttempts != nil {
		n := float64(*f.MaxAttempts)
		if n != math.Trunc(n) || n < 1 || n > maxMaxAttempts {
			return p, fmt.Errorf("max_attempts %v: want a whole number from 1 to %d", n, maxMaxAttempts)
		}
		p.MaxAttempts = int(n)
	}
	if f.ConsequentialFields != nil {
		for _, ptr := range f.ConsequentialFields {
			if err := fingerprint.ValidatePointer(ptr); err != nil {
				return p, fmt.Errorf("consequential_fields %q: %w", ptr, err)
			}
		}
		p.ConsequentialFields = append([]string(nil), f.ConsequentialFields...)
	}
	if f.RunMaxRepeats != nil {
		n, err := runCount("run_max_repeats", float64(*f.RunMaxRepeats))
		if err != nil {
			return p, err
		}
		p.RunMaxRepeats = n
	}
	return p, nil
}
