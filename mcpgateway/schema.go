package mcpgateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// outputSchema compiles a tool's output schema, to check answers against;
// nil for a tool without one. It asserts formats, as the official clients
// do, and loads nothing. It refuses a schema that refers to another
// document (a URL, a file), or whose references loop on an object: the
// official clients cannot compile those either, and fail to list any tool.
// It refuses one whose check of an empty object passes the budget too.
func outputSchema(s any) (*jsonschema.Schema, error) {
	if s == nil {
		return nil, nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	const url = "urn:opledger:output-schema"
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	c.AssertFormat()
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, err
	}
	if !withinBudget(sch, map[string]any{}) {
		return nil, errors.New("checking even an empty object against it takes too many steps")
	}
	if loops(sch.Validate(map[string]any{})) {
		return nil, errors.New("its references loop")
	}
	return sch, nil
}

// fits reports whether v is what schema describes. A check that would
// take more steps than the budget (withinBudget) is not made: v does not
// fit.
func fits(schema *jsonschema.Schema, v any) bool {
	return schema != nil && withinBudget(schema, v) && schema.Validate(v) == nil
}

// withinBudget reports whether checking v against s takes at most 64
// schema evaluations per value in v, plus 4096. Schemas whose branches
// (anyOf, oneOf, ...) each descend into the same values take a time
// exponential in their nesting, or in v's depth: a discriminated union
// of recursive objects, 0.5 s for a thread of 18 replies and twice that
// for each more. The count follows every branch and subschema that
// could apply, so it is an upper bound of the validator's steps; it
// stops at the budget, so it costs no more than a check within it.
func withinBudget(s *jsonschema.Schema, v any) bool {
	c := evalCounter{left: 64*values(v) + 4096}
	return c.visit(s, v, nil)
}

// values counts the JSON values in v: v and every member and item, nested.
func values(v any) int {
	n := 1
	switch x := v.(type) {
	case map[string]any:
		for _, u := range x {
			n += values(u)
		}
	case []any:
		for _, u := range x {
			n += values(u)
		}
	}
	return n
}

// evalCounter counts down the schema evaluations a check may take.
type evalCounter struct{ left int }

// visit counts the evaluation of s at v and those it leads to; path is
// the schemas already evaluated at v on the way (the validator stops at
// a cycle). It returns false once the count passes the budget.
func (c *evalCounter) visit(s *jsonschema.Schema, v any, path []*jsonschema.Schema) bool {
	if s == nil || slices.Contains(path, s) {
		return true
	}
	if c.left--; c.left < 0 {
		return false
	}
	if path == nil {
		var at [4]*jsonschema.Schema // the path starts at each value
		path = at[:0]
	}
	path = append(path, s)
	var buf [8]*jsonschema.Schema // most schemas have fewer subschemas
	for _, sub := range inPlace(buf[:0], s) {
		if !c.visit(sub, v, path) {
			return false
		}
	}
	switch x := v.(type) {
	case map[string]any:
		for k, u := range x {
			if s.PropertyNames != nil && !c.visit(s.PropertyNames, k, nil) || !c.each(members(buf[:0], s, k), u) {
				return false
			}
		}
	case []any:
		for i, u := range x {
			if !c.each(items(buf[:0], s, i), u) {
				return false
			}
		}
	}
	return true
}

// each visits every schema of subs at v.
func (c *evalCounter) each(subs []*jsonschema.Schema, v any) bool {
	for _, sub := range subs {
		if !c.visit(sub, v, nil) {
			return false
		}
	}
	return true
}

// inPlace appends to out the subschemas of s that apply to the value s
// applies to.
func inPlace(out []*jsonschema.Schema, s *jsonschema.Schema) []*jsonschema.Schema {
	out = append(out, s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else)
	if s.DynamicRef != nil {
		out = append(out, s.DynamicRef.Ref)
	}
	out = append(append(append(out, s.AllOf...), s.AnyOf...), s.OneOf...)
	for _, d := range s.DependentSchemas {
		out = append(out, d)
	}
	for _, d := range s.Dependencies {
		if d, ok := d.(*jsonschema.Schema); ok {
			out = append(out, d)
		}
	}
	return out
}

// members appends to out the subschemas of s that may apply to member k
// of an object: all that could, more than the validator applies.
func members(out []*jsonschema.Schema, s *jsonschema.Schema, k string) []*jsonschema.Schema {
	out = append(out, s.Properties[k], s.UnevaluatedProperties)
	if a, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
		out = append(out, a)
	}
	for _, p := range s.PatternProperties {
		out = append(out, p)
	}
	return out
}

// items appends to out the subschemas of s that may apply to item i of an
// array.
func items(out []*jsonschema.Schema, s *jsonschema.Schema, i int) []*jsonschema.Schema {
	out = append(out, s.Items2020, s.Contains, s.UnevaluatedItems)
	switch it := s.Items.(type) {
	case *jsonschema.Schema:
		out = append(out, it)
	case []*jsonschema.Schema:
		if i < len(it) {
			out = append(out, it[i])
		}
	}
	if a, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
		out = append(out, a)
	}
	if i < len(s.PrefixItems) {
		out = append(out, s.PrefixItems[i])
	}
	return out
}

// loops reports whether err, a validation's, is or holds a reference
// cycle.
func loops(err error) bool {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return false
	}
	if _, ok := ve.ErrorKind.(*kind.RefCycle); ok {
		return true
	}
	return slices.ContainsFunc(ve.Causes, func(c *jsonschema.ValidationError) bool { return loops(c) })
}

// noLoader loads no schema: not a file, not a URL.
type noLoader struct{}

// Load refuses url.
func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s: the gateway loads no schema", url)
}
