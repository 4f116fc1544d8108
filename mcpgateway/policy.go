package mcpgateway

import (
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/ledger"
)

// The key modes: where a call's operation id comes from when its _meta
// carries none.
const (
	// keySession derives it from the session, the tool and the
	// consequential arguments, within the dedupe window.
	keySession = "session"
	// keyRequire refuses the call.
	keyRequire = "require"
	// keyNone forwards a read-only tool unrecorded.
	keyNone = "none"
)

var effects = map[string]client.Effect{
	"read_only":    client.EffectReadOnly,
	"idempotent":   client.EffectIdempotent,
	"irreversible": client.EffectIrreversible,
}

// policy is how the gateway treats one tool, resolved from its rule, the
// defaults and the tool's annotations.
type policy struct {
	effect     client.Effect
	key        string
	window     time.Duration
	params     []string
	timeout    time.Duration
	retries    int
	wait       time.Duration
	retryable  bool // an isError result is proven not applied
	resourceID string
	probe      *ProbeConfig
}

// resolve returns the policy of the upstream tool t under the first of
// rules that matches its name, on top of defaults, and that rule's index
// (-1 for none).
func resolve(t *mcp.Tool, rules []ToolRule, defaults ToolRule) (policy, int) {
	r, index := defaults, -1
	for i, rule := range rules {
		if ledger.MatchGlob(rule.Match, t.Name) {
			r, index = merge(defaults, rule), i
			break
		}
	}
	p := policy{
		effect:     annotatedEffect(t.Annotations),
		key:        r.Key,
		window:     orDefault(r.Window, DefaultWindow),
		params:     r.Params,
		timeout:    orDefault(r.Timeout, DefaultTimeout),
		wait:       orDefault(r.Wait, DefaultWait),
		retryable:  r.Errors == "retryable",
		resourceID: r.ResourceID,
		probe:      r.Probe,
	}
	if e, ok := effects[r.Effect]; ok {
		p.effect = e
	}
	if r.Retries != nil {
		p.retries = *r.Retries
	}
	if p.key == "" {
		p.key = keySession
		if p.effect == client.EffectReadOnly {
			p.key = keyNone
		}
	}
	return p, index
}

// annotatedEffect reads a tool's hints: read-only, idempotent, or else
// irreversible (the safe side).
func annotatedEffect(a *mcp.ToolAnnotations) client.Effect {
	switch {
	case a == nil:
		return client.EffectIrreversible
	case a.ReadOnlyHint:
		return client.EffectReadOnly
	case a.IdempotentHint:
		return client.EffectIdempotent
	}
	return client.EffectIrreversible
}

// merge returns rule with its unset fields taken from defaults.
func merge(defaults, rule ToolRule) ToolRule {
	if rule.Key == "" {
		rule.Key = defaults.Key
	}
	if rule.Window == 0 {
		rule.Window = defaults.Window
	}
	if rule.Params == nil {
		rule.Params = defaults.Params
	}
	if rule.Timeout == 0 {
		rule.Timeout = defaults.Timeout
	}
	if rule.Retries == nil {
		rule.Retries = defaults.Retries
	}
	if rule.Wait == 0 {
		rule.Wait = defaults.Wait
	}
	if rule.Errors == "" {
		rule.Errors = defaults.Errors
	}
	if rule.ResourceID == "" {
		rule.ResourceID = defaults.ResourceID
	}
	return rule
}

func orDefault(d Duration, def time.Duration) time.Duration {
	if d > 0 {
		return time.Duration(d)
	}
	return def
}

// clientPolicy is the SDK's policy of the tool.
func (p policy) clientPolicy() client.ToolPolicy {
	return client.ToolPolicy{Timeout: p.timeout, MaxRetries: p.retries, Effect: p.effect}
}
