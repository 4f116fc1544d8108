package mcpgateway

import (
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
)

// TestResolve: a tool's effect is its rule's, else its annotations'
// (read-only, idempotent, anything else irreversible); its key mode is its
// rule's, else none for read-only tools and session for the others; unset
// fields take the defaults, then the built-in ones; the first rule that
// matches wins.
func TestResolve(t *testing.T) {
	two := 2
	rules := []ToolRule{
		{Match: "create_*", Effect: "irreversible", Timeout: Duration(5 * time.Second), Retries: &two, Probe: &ProbeConfig{Tool: "find"}},
		{Match: "create_ticket", Effect: "idempotent"},
		{Match: "search", Key: "session"},
	}
	defaults := ToolRule{Window: Duration(time.Minute)}
	for _, tc := range []struct {
		tool            string
		annotations     *mcp.ToolAnnotations
		effect          client.Effect
		key             string
		timeout, window time.Duration
		retries         int
		probe           bool
		rule            int
	}{
		{"create_ticket", &mcp.ToolAnnotations{ReadOnlyHint: true}, client.EffectIrreversible, keySession, 5 * time.Second, time.Minute, 2, true, 0},
		{"search", &mcp.ToolAnnotations{ReadOnlyHint: true}, client.EffectReadOnly, keySession, DefaultTimeout, time.Minute, 0, false, 2},
		{"lookup", &mcp.ToolAnnotations{ReadOnlyHint: true}, client.EffectReadOnly, keyNone, DefaultTimeout, time.Minute, 0, false, -1},
		{"set_status", &mcp.ToolAnnotations{IdempotentHint: true}, client.EffectIdempotent, keySession, DefaultTimeout, time.Minute, 0, false, -1},
		{"delete", &mcp.ToolAnnotations{}, client.EffectIrreversible, keySession, DefaultTimeout, time.Minute, 0, false, -1},
		{"send", nil, client.EffectIrreversible, keySession, DefaultTimeout, time.Minute, 0, false, -1},
	} {
		p, rule := resolve(&mcp.Tool{Name: tc.tool, Annotations: tc.annotations}, rules, defaults)
		if p.effect != tc.effect || p.key != tc.key || p.timeout != tc.timeout || p.window != tc.window || p.retries != tc.retries || (p.probe != nil) != tc.probe || p.wait != DefaultWait || rule != tc.rule {
			t.Errorf("%s: %+v, rule %d", tc.tool, p, rule)
		}
	}
}
