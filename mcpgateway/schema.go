package mcpgateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// outputURL is the URL an output schema is compiled at.
const outputURL = "urn:opledger:output-schema"

// outputCheck is a tool's output schema, compiled to check answers
// against in each reading an answer must fit: as its dialect says (JSON
// Schema 2020-12 unless its $schema names another), and as the TypeScript
// client reads any schema (draft-07, the dialect of AJV's default class,
// the root's $schema ignored). The two differ: read as draft-07,
// prefixItems is ignored and items applies to every item, so the client
// refuses a tuple 2020-12 takes. A schema whose dialect's reading does
// not compile is refused: the Python client's validator refuses it too,
// on every call (a draft-07 tuple, items an array, is one). One whose
// draft-07 reading does not compile (resources in $defs, which draft-07
// does not know and AJV does) is read as its dialect says alone.
type outputCheck struct{ readings []*reading }

// reading is an output schema compiled one way, with what the budget's
// count needs to know of where its dynamic references resolve.
type reading struct {
	schema *jsonschema.Schema
	// rooted holds the root resource's dynamic anchors, by name. The
	// validator resolves a $dynamicRef to the outermost resource in scope
	// that has its anchor, and the root is always in scope.
	rooted map[string]*jsonschema.Schema
	*anchorCount
}

// anchorCount counts a document's $dynamicAnchor keywords by name, and its
// true $recursiveAnchor ones, data included.
type anchorCount struct {
	anchors   map[string]int
	recursive int
}

// outputSchema compiles a tool's output schema, to check answers against;
// nil for a tool without one. It asserts formats as the TypeScript client
// does, and loads nothing but the built-in meta-schemas. It refuses a
// schema its dialect's reading does not compile, one that refers to
// another document (a URL, a file), or whose references loop on an
// object: the TypeScript client cannot compile those either and then
// lists no tool, and the Python client raises at each call. It refuses
// one whose check of an empty object passes the budget too.
func outputSchema(s any) (*outputCheck, error) {
	if s == nil {
		return nil, nil
	}
	o, err := compileOutput(s)
	if err != nil {
		return nil, err
	}
	if !withinBudget(o, map[string]any{}) {
		return nil, errors.New("checking even an empty object against it takes too many steps")
	}
	for _, r := range o.readings {
		if loops(r.schema.Validate(map[string]any{})) {
			return nil, errors.New("its references loop")
		}
	}
	return o, nil
}

// compileOutput compiles s in its readings and finds its dynamic anchors.
func compileOutput(s any) (*outputCheck, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	count := &anchorCount{anchors: map[string]int{}}
	if count.count(doc) > maxSchemas {
		return nil, fmt.Errorf("it has more than %d schemas, and compiling takes a time quadratic in them", maxSchemas)
	}
	asClient := doc
	if m, ok := doc.(map[string]any); ok {
		m = maps.Clone(m)
		delete(m, "$schema")
		asClient = m
	}
	spec, err := compileReading(doc, jsonschema.Draft2020, count)
	if err != nil {
		return nil, err
	}
	o := &outputCheck{readings: []*reading{spec}}
	if client, err := compileReading(asClient, jsonschema.Draft7, count); err == nil {
		o.readings = append(o.readings, client)
	}
	return o, nil
}

// compileReading compiles doc in draft, unless doc's $schema names
// another, formats and patterns as the TypeScript client reads them.
func compileReading(doc any, draft *jsonschema.Draft, count *anchorCount) (*reading, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(draft)
	c.UseLoader(noLoader{})
	c.AssertFormat()
	for _, f := range clientFormats {
		c.RegisterFormat(f)
	}
	c.UseRegexpEngine(jsRegexp)
	c.RegisterVocabulary(clientMultipleOf)
	c.AssertVocabs()
	if err := c.AddResource(outputURL, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(outputURL)
	if err != nil {
		return nil, err
	}
	r := &reading{schema: sch, rooted: map[string]*jsonschema.Schema{}, anchorCount: count}
	for name := range count.anchors {
		if a, err := c.Compile(outputURL + "#" + name); err == nil && a.DynamicAnchor == name {
			r.rooted[name] = a
		}
	}
	return r, nil
}

// maxSchemas is the most schemas an output schema may have (objects and
// booleans, data included): the compiler looks each up in a list of the
// others, 1.3 s for 20,000.
const maxSchemas = 4096

// count adds doc's $dynamicAnchor and true $recursiveAnchor keywords to
// o's counts, wherever they are, and returns how many objects and
// booleans doc has.
func (o *anchorCount) count(doc any) int {
	n := 0
	switch x := doc.(type) {
	case bool:
		n++
	case map[string]any:
		n++
		if name, ok := x["$dynamicAnchor"].(string); ok {
			o.anchors[name]++
		}
		if x["$recursiveAnchor"] == true {
			o.recursive++
		}
		for _, v := range x {
			n += o.count(v)
		}
	case []any:
		for _, v := range x {
			n += o.count(v)
		}
	}
	return n
}

// dynamicTarget returns the schema a $dynamicRef resolves to; false when
// that depends on the resources a check passes through: another of the
// document's resources has the anchor too.
func (o *reading) dynamicTarget(r *jsonschema.DynamicRef) (*jsonschema.Schema, bool) {
	switch {
	case r.Anchor == "" || r.Ref.DynamicAnchor != r.Anchor:
		return r.Ref, true
	case o.rooted[r.Anchor] != nil:
		return o.rooted[r.Anchor], true
	}
	return r.Ref, alone(o.anchors[r.Anchor], r.Ref)
}

// recursiveTarget returns the schema a $recursiveRef to r resolves to;
// false when that depends on the schemas a check passes through. The
// validator resolves it to the outermost schema on the path whose
// resource has a $recursiveAnchor (not that resource's root): the root,
// when it has one.
func (o *reading) recursiveTarget(r *jsonschema.Schema) (*jsonschema.Schema, bool) {
	switch {
	case !r.RecursiveAnchor:
		return r, true
	case o.schema.RecursiveAnchor:
		return o.schema, true
	}
	return r, o.recursive == 0 && !inDocument(r)
}

// alone reports whether target's anchor is the only one a check may meet,
// given n anchors of that name in the document. A target in a built-in
// meta-schema is met only once the check has left the document.
func alone(n int, target *jsonschema.Schema) bool {
	if inDocument(target) {
		return n == 1
	}
	return n == 0
}

// inDocument reports whether s is in the output schema's document, not in
// a built-in meta-schema.
func inDocument(s *jsonschema.Schema) bool {
	return strings.HasPrefix(s.Location, outputURL+"#")
}

// Why an answer's structured content is not kept: the reason label of
// ledgermcp_answers_as_text_total.
const (
	misfitMissing   = "missing"    // there is none
	misfitShape     = "shape"      // it is not in the schema's shape
	misfitTooCostly = "too_costly" // its check would pass the budget
)

// misfit returns why v is not what o describes, in one of its readings:
// misfitTooCostly for a check that would take more steps than the budget
// (withinBudget), which is not made; misfitShape for a check that fails;
// "" when v fits.
func (o *outputCheck) misfit(v any) string {
	budget := budget(v)
	for _, r := range o.readings {
		switch {
		case !r.withinBudget(v, budget):
			return misfitTooCostly
		case r.schema.Validate(v) != nil:
			return misfitShape
		}
	}
	return ""
}

// fits reports whether v is what o describes.
func fits(o *outputCheck, v any) bool {
	return o != nil && o.misfit(v) == ""
}

// withinBudget reports whether checking v against o takes at most 64
// schema evaluations per value in v, plus 4096. Schemas whose branches
// (anyOf, oneOf, ...) each descend into the same values take a time
// exponential in their nesting, or in v's depth: a discriminated union
// of recursive objects, 0.5 s for a thread of 18 replies and twice that
// for each more. The count follows every branch and subschema that
// could apply, and each reference where the validator resolves it, so it
// is an upper bound of the validator's steps; it stops at the budget, so
// it costs no more than a check within it. A dynamic reference the count
// cannot resolve (dynamicTarget) passes the budget, and so does a check
// past the limits (maxDepth, maxInPlace).
func withinBudget(o *outputCheck, v any) bool {
	budget := budget(v)
	for _, r := range o.readings {
		if !r.withinBudget(v, budget) {
			return false
		}
	}
	return true
}

// budget is the most schema evaluations a check of v may take.
func budget(v any) int { return 64*values(v) + 4096 }

// withinBudget is withinBudget for one reading, given v's budget.
func (r *reading) withinBudget(v any, budget int) bool {
	c := evalCounter{o: r, left: budget}
	return c.visit(r.schema, v, nil)
}

// The limits of a check besides the budget. Each of the validator's
// steps walks the schemas it has entered at the value, and copies or
// walks the way there from the root (for a dynamic reference, every
// schema on it): without limits a check takes a time quadratic in v's
// depth, or in a chain of references.
const (
	maxDepth   = 128 // levels of values in v a check descends
	maxInPlace = 64  // schemas entered at one value, each within the last
)

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

// evalCounter counts down the schema evaluations a check against o may
// take.
type evalCounter struct {
	o     *reading
	left  int
	depth int // of the value visited: 0 for the answer, 1 for its members
}

// visit counts the evaluation of s at v and those it leads to; path is
// the schemas already evaluated at v on the way (the validator stops at
// a cycle). It returns false once the count passes the budget.
func (c *evalCounter) visit(s *jsonschema.Schema, v any, path []*jsonschema.Schema) bool {
	if s == nil || slices.Contains(path, s) {
		return true
	}
	if c.left--; c.left < 0 || len(path) == maxInPlace || c.depth == maxDepth {
		return false
	}
	if path == nil {
		var at [4]*jsonschema.Schema // the path starts at each value
		path = at[:0]
	}
	path = append(path, s)
	var buf [8]*jsonschema.Schema // most schemas have fewer subschemas
	subs, ok := c.inPlace(buf[:0], s)
	if !ok {
		return false
	}
	for _, sub := range subs {
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

// each visits every schema of subs at v, a member or item of the value
// visited.
func (c *evalCounter) each(subs []*jsonschema.Schema, v any) bool {
	c.depth++
	for _, sub := range subs {
		if !c.visit(sub, v, nil) {
			return false // which ends the count
		}
	}
	c.depth--
	return true
}

// inPlace appends to out the subschemas of s that apply to the value s
// applies to; false when it cannot tell where a dynamic reference of s
// resolves.
func (c *evalCounter) inPlace(out []*jsonschema.Schema, s *jsonschema.Schema) ([]*jsonschema.Schema, bool) {
	out = append(out, s.Ref, s.Not, s.If, s.Then, s.Else)
	if s.RecursiveRef != nil {
		r, ok := c.o.recursiveTarget(s.RecursiveRef)
		if !ok {
			return nil, false
		}
		out = append(out, r)
	}
	if s.DynamicRef != nil {
		r, ok := c.o.dynamicTarget(s.DynamicRef)
		if !ok {
			return nil, false
		}
		out = append(out, r)
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
	return out, true
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

// outputs compiles the output schemas of one upstream's listings. It
// keeps those of the last listing, by their JSON: a schema listed again
// is not compiled again.
type outputs struct {
	last, next map[string]compiled
	compileFn  func(any) (*outputCheck, error)
}

// compiled is a schema's outputSchema answer.
type compiled struct {
	check *outputCheck
	err   error
}

func newOutputs() outputs {
	return outputs{last: map[string]compiled{}, next: map[string]compiled{}, compileFn: outputSchema}
}

// compile returns outputSchema(s), compiling s only when neither the
// last listing nor this one had it.
func (o *outputs) compile(s any) (*outputCheck, error) {
	if s == nil {
		return nil, nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	c, ok := o.next[string(b)]
	if !ok {
		c, ok = o.last[string(b)]
	}
	if !ok {
		c.check, c.err = o.compileFn(s)
	}
	o.next[string(b)] = c
	return c.check, c.err
}

// done ends a listing: its schemas are the ones kept for the next.
func (o *outputs) done() {
	o.last, o.next = o.next, map[string]compiled{}
}
