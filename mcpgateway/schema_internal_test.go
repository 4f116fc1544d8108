package mcpgateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// threadSchema is a comment whose replies are a discriminated union of
// comments and notes, the note first: each reply is checked against both,
// and both descend into its replies.
func threadSchema() any {
	items := map[string]any{"oneOf": []any{map[string]any{"$ref": "#/$defs/note"}, map[string]any{"$ref": "#/$defs/comment"}}}
	object := func(kind string) any {
		return map[string]any{"type": "object", "required": []any{"kind"}, "properties": map[string]any{
			"kind": map[string]any{"const": kind}, "replies": map[string]any{"type": "array", "items": items}}}
	}
	return map[string]any{"$ref": "#/$defs/comment", "$defs": map[string]any{"comment": object("comment"), "note": object("note")}}
}

// thread is a comment with a chain of depth replies.
func thread(depth int) map[string]any {
	c := map[string]any{"kind": "comment"}
	for range depth {
		c = map[string]any{"kind": "comment", "replies": []any{c}}
	}
	return c
}

// anyOfChain is n definitions, each any of the next one twice.
func anyOfChain(n int) any {
	defs := map[string]any{fmt.Sprint(n): map[string]any{"type": "object"}}
	for i := range n {
		next := map[string]any{"$ref": fmt.Sprintf("#/$defs/%d", i+1)}
		defs[fmt.Sprint(i)] = map[string]any{"anyOf": []any{next, next}}
	}
	return map[string]any{"$ref": "#/$defs/0", "$defs": defs}
}

// TestWithinBudget: a check of an answer is made when it takes at most 64
// schema evaluations per value, plus 4096: any schema of a shape a check
// is linear in (a recursive tree, a long list) is; branches that multiply
// with nesting, in the schema or in the answer, are not.
func TestWithinBudget(t *testing.T) {
	tree := map[string]any{"$ref": "#/$defs/node", "$defs": map[string]any{"node": map[string]any{"type": "object",
		"properties": map[string]any{"name": map[string]any{"type": "string"}, "children": map[string]any{"type": "array",
			"items": map[string]any{"$ref": "#/$defs/node"}}}, "additionalProperties": false}}}
	var node func(depth int) map[string]any
	node = func(depth int) map[string]any {
		n := map[string]any{"name": "n"}
		if depth > 0 {
			n["children"] = []any{node(depth - 1), node(depth - 1)}
		}
		return n
	}
	list := make([]any, 10000)
	for i := range list {
		list[i] = map[string]any{"id": fmt.Sprint(i), "n": float64(i)}
	}
	row := map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string"},
		"n": map[string]any{"type": "number"}}, "required": []any{"id"}}
	for _, tc := range []struct {
		name   string
		schema any
		v      any
		within bool
	}{
		{"a tree of 2047 nodes", tree, node(10), true},
		{"a list of 10000 rows", map[string]any{"type": "array", "uniqueItems": true, "items": row}, list, true},
		{"rows any of three shapes", map[string]any{"type": "array", "items": map[string]any{"anyOf": []any{row, row, row}}}, list, true},
		{"a thread of 3 replies", threadSchema(), thread(3), true},
		{"a thread of 24 replies", threadSchema(), thread(24), false},
		{"a chain of 8 doubling branches", anyOfChain(8), map[string]any{}, true},
		{"a chain of 30 doubling branches", anyOfChain(30), map[string]any{}, false},
		{"a reference that loops", map[string]any{"$ref": "#"}, map[string]any{"a": []any{1.0}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := json.Marshal(tc.schema)
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			c := jsonschema.NewCompiler()
			if err := c.AddResource("urn:test", doc); err != nil {
				t.Fatal(err)
			}
			s, err := c.Compile("urn:test")
			if err != nil {
				t.Fatal(err)
			}
			if got := withinBudget(s, tc.v); got != tc.within {
				t.Fatalf("within the budget: %v, want %v", got, tc.within)
			}
		})
	}
}
