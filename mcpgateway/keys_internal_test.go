package mcpgateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/fingerprint"
)

func TestReadMeta(t *testing.T) {
	for _, tc := range []struct {
		meta string
		want callMeta
		err  string
	}{
		{meta: `{}`},
		{meta: `{"idempotencyKey": "k1"}`, want: callMeta{key: "k1"}},
		{meta: `{"io.github.opledger/operationId": "k1"}`, want: callMeta{key: "k1"}},
		{meta: `{"idempotencyKey": "k1", "io.github.opledger/operationId": "k1"}`, want: callMeta{key: "k1"}},
		{meta: `{"io.github.opledger/runId": "run-7", "io.github.opledger/permitId": "approval-3", "progressToken": 4}`, want: callMeta{runID: "run-7", permitID: "approval-3"}},
		{meta: `{"idempotencyKey": "k1", "io.github.opledger/operationId": "k2"}`, err: "differ"},
		{meta: `{"idempotencyKey": 12}`, err: "non-empty string"},
		{meta: `{"idempotencyKey": ""}`, err: "non-empty string"},
		{meta: `{"io.github.opledger/runId": {"a": 1}}`, err: "non-empty string"},
		{meta: `{"idempotencyKey": null}`},
	} {
		var m mcp.Meta
		if err := json.Unmarshal([]byte(tc.meta), &m); err != nil {
			t.Fatal(err)
		}
		got, err := readMeta(m)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.meta, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s = %+v, %v; want %+v", tc.meta, got, err, tc.want)
		}
	}
}

// FuzzReadMeta: no _meta a caller sends makes readMeta panic, and a key
// it returns is one the caller sent.
func FuzzReadMeta(f *testing.F) {
	f.Add(`{"idempotencyKey": "k1", "io.github.opledger/runId": "r"}`)
	f.Add(`{"io.github.opledger/operationId": ["x"]}`)
	f.Fuzz(func(t *testing.T, doc string) {
		var m mcp.Meta
		if json.Unmarshal([]byte(doc), &m) != nil {
			return
		}
		c, err := readMeta(m)
		if err == nil && c.key != "" && c.key != m[MetaIdempotencyKey] && c.key != m[MetaOperationID] {
			t.Fatalf("key %q is none the caller sent in %s", c.key, doc)
		}
	})
}

// TestForwardMeta: the upstream gets the caller's other _meta, and (for a
// recorded call) the operation id as its idempotency key, never the
// caller's own key, run, permit or progress token, nor the protocol's
// reserved keys of the caller's hop.
func TestForwardMeta(t *testing.T) {
	in := mcp.Meta{"idempotencyKey": "caller", MetaRunID: "r", MetaPermitID: "p", "progressToken": "t", "traceparent": "00-ab",
		"io.modelcontextprotocol/protocolVersion": "2026-07-28", "dev.mcp.x/y": 1, "com.example/z": 2}
	got := forwardMeta(in, client.Attempt{OperationID: "op-1", IdempotencyKey: "op-1", FencingToken: 42})
	want := mcp.Meta{"idempotencyKey": "op-1", MetaOperationID: "op-1", MetaFencingToken: "42", "traceparent": "00-ab", "com.example/z": 2}
	if jsonOf(got) != jsonOf(want) {
		t.Fatalf("forwardMeta = %s, want %s", jsonOf(got), jsonOf(want))
	}
	if in["idempotencyKey"] != "caller" {
		t.Fatal("forwardMeta changed the caller's _meta")
	}
	if got := passedMeta(in); jsonOf(got) != `{"com.example/z":2,"traceparent":"00-ab"}` {
		t.Fatalf("passedMeta = %s, want only the caller's other keys", jsonOf(got))
	}
}

// TestIntentBase: one base per scope, tool and fingerprint; each of them
// makes another one.
func TestIntentBase(t *testing.T) {
	fp := func(s string) fingerprint.Fingerprint {
		f, _ := fingerprint.Compute(map[string]any{"a": s}, nil)
		return f
	}
	base := intentBase("t_create", "http-S1", fp("x"))
	if !strings.HasPrefix(base, "mcp:t_create:") || len(base) > 200 {
		t.Fatalf("base %q", base)
	}
	seen := map[string]bool{base: true}
	for _, other := range []string{
		intentBase("t_create", "http-S2", fp("x")),
		intentBase("t_delete", "http-S1", fp("x")),
		intentBase("t_create", "http-S1", fp("y")),
		intentBase("t_create", "http-S1\x00t_create", fp("x")),
	} {
		if seen[other] {
			t.Errorf("%q repeats a base", other)
		}
		seen[other] = true
	}
	if again := intentBase("t_create", "http-S1", fp("x")); again != base {
		t.Fatalf("not stable: %q, %q", base, again)
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
