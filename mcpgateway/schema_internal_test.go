package mcpgateway

import (
	"fmt"
	"testing"
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

// dynamicThread is threadSchema with its union bound late: the replies of
// a generic resource are a $dynamicRef to an anchor that accepts anything,
// which the document's root resource binds to the union.
func dynamicThread() any {
	base := map[string]any{"$id": "urn:test:base", "$defs": map[string]any{"reply": map[string]any{"$dynamicAnchor": "reply"}},
		"type": "object", "properties": map[string]any{"replies": map[string]any{"type": "array", "items": map[string]any{"$dynamicRef": "#reply"}}}}
	object := func(kind string) any {
		return map[string]any{"$ref": "urn:test:base", "required": []any{"kind"}, "properties": map[string]any{"kind": map[string]any{"const": kind}}}
	}
	union := map[string]any{"$dynamicAnchor": "reply", "oneOf": []any{map[string]any{"$ref": "#/$defs/note"}, map[string]any{"$ref": "#/$defs/comment"}}}
	return map[string]any{"$ref": "#/$defs/comment", "$defs": map[string]any{"base": base, "reply": union,
		"note": object("note"), "comment": object("comment")}}
}

// withID returns schema s with an $id.
func withID(s any, id string) any {
	s.(map[string]any)["$id"] = id
	return s
}

// dynamicTree is a generic tree resource whose children are a $dynamicRef
// to its own root. With extended, the document's root extends it (binds
// the anchor again), as JSON Schema's examples do.
func dynamicTree(extended bool) any {
	tree := map[string]any{"$id": "urn:test:tree", "$dynamicAnchor": "node", "type": "object", "properties": map[string]any{
		"name": map[string]any{"type": "string"}, "children": map[string]any{"type": "array", "items": map[string]any{"$dynamicRef": "#node"}}}}
	root := map[string]any{"$ref": "urn:test:tree", "$defs": map[string]any{"tree": tree}}
	if extended {
		root["$dynamicAnchor"], root["required"] = "node", []any{"name"}
	}
	return root
}

// recursiveThread is threadSchema in draft 2019-09's terms, in a resource
// of its own whose root accepts anything and has a $recursiveAnchor:
// replies are a $recursiveRef to that root, and the document's root refers
// to the union. With rooted, the document's root has a $recursiveAnchor
// too, and replies resolve to it; without, to the union, the outermost
// schema on the way that is in a resource with the anchor.
func recursiveThread(rooted bool) any {
	object := func(kind string) any {
		return map[string]any{"type": "object", "required": []any{"kind"}, "properties": map[string]any{"kind": map[string]any{"const": kind},
			"replies": map[string]any{"type": "array", "items": map[string]any{"$recursiveRef": "#"}}}}
	}
	union := map[string]any{"oneOf": []any{map[string]any{"$ref": "#/$defs/note"}, map[string]any{"$ref": "#/$defs/comment"}}}
	thread := map[string]any{"$id": "urn:test:thread", "$recursiveAnchor": true,
		"$defs": map[string]any{"union": union, "note": object("note"), "comment": object("comment")}}
	return map[string]any{"$schema": "https://json-schema.org/draft/2019-09/schema", "$recursiveAnchor": rooted,
		"$ref": "urn:test:thread#/$defs/union", "$defs": map[string]any{"thread": thread}}
}

// TestWithinBudget: a check of an answer is made when it takes at most 64
// schema evaluations per value, plus 4096: any schema of a shape a check
// is linear in (a recursive tree, a long list) is; branches that multiply
// with nesting, in the schema or in the answer, are not, even behind a
// dynamic reference; nor is one that reaches a dynamic reference whose
// target depends on the path.
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
	// Two resources bind the same anchor, and the root neither: where a
	// reference resolves depends on which of them a check passed through.
	twoBindings := map[string]any{"$ref": "urn:test:a", "$defs": map[string]any{
		"a": map[string]any{"$id": "urn:test:a", "$dynamicAnchor": "n", "properties": map[string]any{"x": map[string]any{"$ref": "urn:test:b"}}},
		"b": map[string]any{"$id": "urn:test:b", "$dynamicAnchor": "n", "properties": map[string]any{"x": map[string]any{"$dynamicRef": "#n"}}}}}
	schema := map[string]any{"type": "object"} // a JSON Schema as an answer, checked against the meta-schema
	for range 60 {
		schema = map[string]any{"properties": map[string]any{"a": schema}, "anyOf": []any{map[string]any{"type": "object"}}}
	}
	deep := map[string]any{"name": "n"} // a tree of one branch, 9001 nodes deep
	for range 9000 {
		deep = map[string]any{"name": "n", "children": []any{deep}}
	}
	chain := func(n int) any { // a member's schema: a chain of n references
		defs := map[string]any{fmt.Sprint(n): map[string]any{"type": "number"}}
		for i := range n {
			defs[fmt.Sprint(i)] = map[string]any{"$ref": fmt.Sprintf("#/$defs/%d", i+1)}
		}
		return map[string]any{"properties": map[string]any{"a": map[string]any{"$ref": "#/$defs/0"}}, "$defs": defs}
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
		{"a thread of 3 replies, bound late", dynamicThread(), thread(3), true},
		{"a thread of 24 replies, bound late", dynamicThread(), thread(24), false},
		{"a thread of 3 replies, bound late at an $id", withID(dynamicThread(), "https://example.com/thread"), thread(3), true},
		{"a generic tree of 2047 nodes", dynamicTree(false), node(10), true},
		{"an extended tree of 2047 nodes", dynamicTree(true), node(10), true},
		{"a thread of 3 replies, recursive", recursiveThread(true), thread(3), true},
		{"a thread of 24 replies, recursive", recursiveThread(true), thread(24), false},
		{"a thread of 24 replies, recursive in a resource", recursiveThread(false), thread(24), false},
		{"an anchor two resources bind", twoBindings, map[string]any{"x": map[string]any{"x": 1.0}}, false},
		{"an anchor two resources bind, not reached", twoBindings, map[string]any{"x": 1.0}, true},
		{"a tree 9001 nodes deep", tree, deep, false},
		{"an object 9001 nodes deep, of a schema that does not descend", map[string]any{"type": "object"}, deep, true},
		{"a chain of 60 references", chain(60), map[string]any{"a": 1.0}, true},
		{"a chain of 2000 references", chain(2000), map[string]any{"a": 1.0}, false},
		{"a schema 60 deep, against the meta-schema", map[string]any{"$ref": "https://json-schema.org/draft/2020-12/schema"}, schema, true},
		{"a schema 60 deep, against draft 2019-09's", map[string]any{"$ref": "https://json-schema.org/draft/2019-09/schema"}, schema, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := compileOutput(tc.schema)
			if err != nil {
				t.Fatal(err)
			}
			if got := withinBudget(o, tc.v); got != tc.within {
				t.Fatalf("within the budget: %v, want %v", got, tc.within)
			}
			if !tc.within {
				return // the check itself would take minutes
			}
			if err := o.validate(tc.v); err != nil && !loops(err) {
				t.Fatalf("the answer does not fit: %v", err) // a row that checks nothing
			}
		})
	}
}

// validate returns v's refusal by o's first reading that refuses it; nil
// when every reading takes it.
func (o *outputCheck) validate(v any) error {
	for _, r := range o.readings {
		if err := r.schema.Validate(v); err != nil {
			return err
		}
	}
	return nil
}

// TestReadings: an answer fits only if it fits the schema both as its
// dialect says and as the TypeScript client reads it (draft-07, and
// multipleOf divided in floating point), so no answer the gateway keeps
// makes that client throw; with node and
// examples/mcp/node installed, the client itself checks every row
// (required with LEDGER_TEST_POLYGLOT=require).
func TestReadings(t *testing.T) {
	pair := func(s map[string]any) map[string]any {
		return map[string]any{"type": "object", "properties": map[string]any{"p": s}}
	}
	str, integer := map[string]any{"type": "string"}, map[string]any{"type": "integer"}
	ticket := map[string]any{"type": "object", "properties": map[string]any{"id": str}, "required": []any{"id"}}
	price := map[string]any{"properties": map[string]any{"x": map[string]any{"type": "number", "multipleOf": 0.01}}}
	rows := []struct {
		name    string
		schema  map[string]any
		value   map[string]any
		gateway bool // the gateway keeps the answer
		client  bool // the client takes it
	}{
		{"a ticket", ticket, map[string]any{"id": "T-1"}, true, true},
		{"a 2020-12 tuple, items false", pair(map[string]any{"type": "array", "prefixItems": []any{str, integer}, "items": false}),
			map[string]any{"p": []any{"a", 1.0}}, false, false},
		{"a 2020-12 tuple, items for the rest", pair(map[string]any{"type": "array", "prefixItems": []any{str}, "items": integer}),
			map[string]any{"p": []any{"a", 1.0}}, false, false},
		{"a 2020-12 tuple, its length bounded", pair(map[string]any{"type": "array", "prefixItems": []any{str, integer}, "minItems": 2, "maxItems": 2}),
			map[string]any{"p": []any{"a", 1.0}}, true, true},
		{"contains, minContains 0", pair(map[string]any{"type": "array", "contains": str, "minContains": 0.0}), map[string]any{"p": []any{}}, false, false},
		{"$ref beside type", map[string]any{"properties": map[string]any{"x": map[string]any{"$ref": "#/definitions/a", "type": "string"}},
			"definitions": map[string]any{"a": map[string]any{}}}, map[string]any{"x": 1.0}, false, false},
		{"dependencies", map[string]any{"dependencies": map[string]any{"a": []any{"b"}}}, map[string]any{"a": 1.0}, false, false},
		{"unevaluatedProperties, which the client ignores", map[string]any{"properties": map[string]any{"a": map[string]any{}},
			"unevaluatedProperties": false}, map[string]any{"a": 1.0, "b": 2.0}, false, true},
		{"a price of 7 cents, multipleOf 0.01", price, map[string]any{"x": 0.07}, false, false},
		{"a price of 50 cents, multipleOf 0.01", price, map[string]any{"x": 0.5}, true, true},
		{"1e21, multipleOf 1", map[string]any{"properties": map[string]any{"x": map[string]any{"multipleOf": 1.0}}}, map[string]any{"x": 1e21}, false, false},
		{"a resource in $defs", map[string]any{"$ref": "urn:test:ticket", "$defs": map[string]any{"t": map[string]any{"$id": "urn:test:ticket",
			"type": "object", "required": []any{"id"}}}}, map[string]any{"id": 1.0}, true, true},
	}
	for _, r := range rows {
		o, err := outputSchema(r.schema)
		if err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		if got := fits(o, r.value); got != r.gateway || got && !r.client {
			t.Errorf("%s: kept %v, want %v", r.name, got, r.gateway)
		}
	}

	type row struct {
		Schema map[string]any `json:"schema"`
		Value  map[string]any `json:"value"`
	}
	var in []row
	for _, r := range rows {
		in = append(in, row{r.schema, r.value})
	}
	var verdicts []struct{ Compiles, Valid bool }
	runClient(t, "client_schemas.mjs", in, &verdicts)
	if len(verdicts) != len(rows) {
		t.Fatalf("client_schemas.mjs gave %d verdicts for %d rows", len(verdicts), len(rows))
	}
	for i, r := range rows {
		if v := verdicts[i]; !v.Compiles || v.Valid != r.client {
			t.Errorf("%s: the client compiles it %v and takes the answer %v, want %v", r.name, v.Compiles, v.Valid, r.client)
		}
	}

	var python []struct {
		SchemaOK bool `json:"schema_ok"`
		Valid    bool
	}
	runPython(t, "python_schemas.py", in, &python)
	if len(python) != len(rows) {
		t.Fatalf("python_schemas.py gave %d verdicts for %d rows", len(python), len(rows))
	}
	for i, r := range rows {
		if v := python[i]; !v.SchemaOK || r.gateway && !v.Valid {
			t.Errorf("%s: the Python client takes the schema %v and the answer %v; the gateway keeps it: %v", r.name, v.SchemaOK, v.Valid, r.gateway)
		}
	}
}

// TestOutputs: a listing compiles only the output schemas that neither it
// nor the listing before had, and answers as outputSchema does, a refusal
// included.
func TestOutputs(t *testing.T) {
	a := map[string]any{"type": "object"}
	b := map[string]any{"type": "object", "required": []any{"id"}}
	b2 := map[string]any{"type": "object", "required": []any{"title"}}
	remote := map[string]any{"$ref": "https://elsewhere.example/ticket.json"}
	for _, tc := range []struct {
		name     string
		listings [][]any
		compiles []int // per listing
	}{
		{"listed again", [][]any{{a, b}, {a, b}, {b, a}}, []int{2, 0, 0}},
		{"one changed", [][]any{{a, b}, {a, b2}}, []int{2, 1}},
		{"twice in a listing, and none", [][]any{{a, a, nil}}, []int{1}},
		{"refused, listed again", [][]any{{remote, a}, {remote}}, []int{2, 0}},
		{"left out of a listing, then back", [][]any{{a, b}, {a}, {a, b}}, []int{2, 0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOutputs()
			n := 0
			o.compileFn = func(s any) (*outputCheck, error) { n++; return outputSchema(s) }
			for i, listing := range tc.listings {
				n = 0
				for _, s := range listing {
					got, err := o.compile(s)
					want, wantErr := outputSchema(s)
					if (got == nil) != (want == nil) || (err == nil) != (wantErr == nil) {
						t.Errorf("listing %d: %v: (%v, %v), want (%v, %v)", i, s, got, err, want, wantErr)
					}
				}
				o.done()
				if n != tc.compiles[i] {
					t.Errorf("listing %d compiled %d schemas, want %d", i, n, tc.compiles[i])
				}
			}
		})
	}
}

// BenchmarkOutputs: a listing of one tool whose output schema has 4,096
// objects, first listed and listed again.
func BenchmarkOutputs(b *testing.B) {
	s := map[string]any{"type": "object", "properties": manyProperties(4093)}
	for _, again := range []bool{false, true} {
		b.Run(fmt.Sprintf("again=%v", again), func(b *testing.B) {
			o := newOutputs()
			for b.Loop() {
				if !again {
					o = newOutputs()
				}
				if _, err := o.compile(s); err != nil {
					b.Fatal(err)
				}
				o.done()
			}
		})
	}
}
