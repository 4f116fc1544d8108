package mcpgateway

import (
	"reflect"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/ledger"
)

// TestServed: an upstream tool is served under its prefixed name with an
// object input schema; one whose name the ledger cannot record, or whose
// input is not an object, is not served, and the error says why.
func TestServed(t *testing.T) {
	long := strings.Repeat("t", ledger.MaxToolLen-len("p_")+1)
	for _, tc := range []struct {
		name   string
		schema any
		want   any    // the served input schema
		err    string // else
	}{
		{name: "create", schema: map[string]any{"type": "object", "required": []any{"a"}}, want: map[string]any{"type": "object", "required": []any{"a"}}},
		{name: "create", schema: nil, want: map[string]any{"type": "object"}},
		{name: "create", schema: map[string]any{"properties": map[string]any{}}, want: map[string]any{"type": "object", "properties": map[string]any{}}},
		{name: long[1:], schema: nil, want: map[string]any{"type": "object"}},
		{name: long, schema: nil, err: "is not one the ledger records"},
		{name: "open ticket", schema: nil, err: `the name "p_open ticket" is not one the ledger records: invalid argument: tool: may only hold letters, digits and . _ - : /`},
		{name: "files:read", schema: nil, want: map[string]any{"type": "object"}},
		{name: "files/read.v2", schema: nil, want: map[string]any{"type": "object"}},
		{name: "create", schema: map[string]any{"type": "array"}, err: "input schema of type array, not object"},
		{name: "create", schema: []any{}, err: "input schema of Go type []interface {}"},
	} {
		def, err := served(&mcp.Tool{Name: tc.name, InputSchema: tc.schema}, "p_")
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q with %v: %v, want an error with %q", tc.name, tc.schema, err, tc.err)
			}
		case err != nil || def.Name != "p_"+tc.name || !reflect.DeepEqual(def.InputSchema, tc.want):
			t.Errorf("%q with %v: %+v, %v; want p_%s with %v", tc.name, tc.schema, def, err, tc.name, tc.want)
		}
	}
}
