package ledger

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/mdtable"
)

// yamlKeys returns the keys a YAML document may use for the struct type t,
// in order: each field's yaml tag (or its lower-cased name when it has
// none), the keys of inline structs in their place, and by key the name of
// the Go field that holds it.
func yamlKeys(t reflect.Type) (keys []string, fields map[string]string) {
	fields = map[string]string{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if slices.Contains(strings.Split(opts, ","), "inline") {
			inner, innerFields := yamlKeys(f.Type)
			keys = append(keys, inner...)
			for k, v := range innerFields {
				fields[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		keys = append(keys, name)
		fields[name] = f.Name
	}
	return keys, fields
}

// policyFieldKeys returns the fields of a policy the policy file accepts
// (under defaults and in every rule), by the name of the Policy field each
// one sets. It fails the test unless the parser refuses a field it does
// not know (so the struct tags are all it accepts) and each field sets the
// Policy field of the same name.
func policyFieldKeys(t *testing.T) (keys []string, fields map[string]string) {
	t.Helper()
	keys, fields = yamlKeys(reflect.TypeOf(policyFields{}))
	if len(keys) == 0 {
		t.Fatal("ledger: no policy fields found")
	}
	for _, doc := range []string{
		"defaults:\n  no_such_field: 1\n",
		"tools:\n  - match: x\n    no_such_field: 1\n",
	} {
		if _, err := ParsePolicies([]byte(doc)); err == nil {
			t.Errorf("ledger: ParsePolicies accepts an unknown field:\n%s", doc)
		}
	}
	pol := reflect.TypeOf(Policy{})
	for _, k := range keys {
		if _, ok := pol.FieldByName(fields[k]); !ok {
			t.Errorf("ledger: the policy file's field %s (policyFields.%s) has no Policy field of that name", k, fields[k])
		}
	}
	return keys, fields
}

// TestPolicyDocsMatchParser holds the policy fields of docs/configuration.md
// (the table of section 6.2) to the fields ParsePolicies accepts: every
// field documented, nothing documented that it refuses, each built-in
// default as the table gives it (a default written in the file gives the
// same policy as none) and each range of durations and integers as the
// parser checks it (checkAllowed). The top-level keys (section 6.1) and
// the keys of a rule (section 6.4) are held to the file's structure.
func TestPolicyDocsMatchParser(t *testing.T) {
	keys, fields := policyFieldKeys(t)
	const docName = "docs/configuration.md"
	d, err := mdtable.Read(docName)
	if err != nil {
		t.Fatal(err)
	}
	empty, err := ParsePolicies(nil)
	if err != nil {
		t.Fatal(err)
	}
	builtIn := reflect.ValueOf(empty.For("default", "docs.check"))

	const fieldsSection = "6.2 Fields"
	s, ok := d.Section(fieldsSection)
	if !ok {
		t.Fatalf("%s: no section %q (the table of policy fields)", docName, fieldsSection)
	}
	tb, ok := s.TableWith("field", "built-in default")
	if !ok {
		t.Fatalf("%s, section %q: no table with columns field and built-in default", docName, fieldsSection)
	}
	documented := map[string]bool{}
	for _, r := range tb.Rows {
		names := mdtable.CodeSpans(r.Cell(tb.Column("field")))
		if len(names) != 1 {
			t.Errorf("%s: a row of the table of policy fields names %d fields (`name`); want one", tb.Where(r), len(names))
			continue
		}
		key := names[0]
		documented[key] = true
		goName, ok := fields[key]
		if !ok {
			t.Errorf("%s: documents the policy field %s, which the policy file does not accept", tb.Where(r), key)
			continue
		}
		want := builtIn.FieldByName(goName)
		if !want.IsValid() {
			continue // reported by policyFieldKeys
		}
		checkAllowed(t, tb, r, key)
		cell := r.Cell(tb.Column("built-in default"))
		if spans := mdtable.CodeSpans(cell); len(spans) > 0 {
			doc := fmt.Sprintf("defaults:\n  %s: %s\n", key, spans[0])
			p, err := ParsePolicies([]byte(doc))
			if err != nil {
				t.Errorf("%s: the documented default of %s, %s, is refused: %v", tb.Where(r), key, spans[0], err)
			} else if got := reflect.ValueOf(p.For("default", "docs.check")); !reflect.DeepEqual(got.Interface(), builtIn.Interface()) {
				t.Errorf("%s: documents the default of %s as %s; the built-in default is %v", tb.Where(r), key, spans[0], want)
			}
			continue
		}
		word := strings.ToLower(cell)
		isEmpty := want.IsZero() || (want.Kind() == reflect.Slice && want.Len() == 0)
		if (strings.HasPrefix(word, "empty") || strings.HasPrefix(word, "none")) && !isEmpty {
			t.Errorf("%s: documents the default of %s as empty; the built-in default is %v", tb.Where(r), key, want)
		}
	}
	for _, k := range keys {
		if !documented[k] {
			t.Errorf("%s: the table of policy fields (line %d) does not document %s (the built-in default is %v)", docName, tb.Line, k, builtIn.FieldByName(fields[k]))
		}
	}

	// The keys around the fields: the file's two top-level keys, and a
	// rule's patterns.
	top, _ := yamlKeys(reflect.TypeOf(policyFile{}))
	rule, _ := yamlKeys(reflect.TypeOf(policyRuleY{}))
	rule = slices.DeleteFunc(rule, func(k string) bool { return slices.Contains(keys, k) })
	for _, c := range []struct {
		section string
		keys    []string
	}{
		{"6.1 Format", top},
		{"6.4 `tools` rules", rule},
	} {
		s, ok := d.Section(c.section)
		if !ok {
			t.Errorf("%s: no section %q (it documents %s)", docName, c.section, strings.Join(c.keys, ", "))
			continue
		}
		lines, _ := s.Text()
		spans := mdtable.CodeSpans(strings.Join(lines, "\n"))
		for _, k := range c.keys {
			if !slices.Contains(spans, k) {
				t.Errorf("%s: section %q does not document the key %s (as `%s`)", docName, c.section, k, k)
			}
		}
	}
}

// documentedRange is an "allowed" cell that gives a range: "`10ms` to `24h`".
var documentedRange = regexp.MustCompile("^`([^`]+)` to `([^`]+)`")

// checkAllowed holds the range the "allowed" cell of row r gives to what
// ParsePolicies accepts, for a duration or an integer field: both ends
// accepted, and a value just outside either refused (1ns for a duration,
// 1 for an integer; below 0 is not tried).
func checkAllowed(t *testing.T, tb mdtable.Table, r mdtable.Row, key string) {
	t.Helper()
	m := documentedRange.FindStringSubmatch(r.Cell(tb.Column("allowed")))
	if m == nil {
		return
	}
	var below, above string
	switch typ := r.Cell(tb.Column("type")); typ {
	case "duration":
		lo, err1 := time.ParseDuration(m[1])
		hi, err2 := time.ParseDuration(m[2])
		if err1 != nil || err2 != nil {
			t.Errorf("%s: the range of %s, %s to %s, is not two durations", tb.Where(r), key, m[1], m[2])
			return
		}
		if lo > 0 {
			below = (lo - 1).String()
		}
		above = (hi + 1).String()
	case "integer":
		lo, err1 := strconv.Atoi(m[1])
		hi, err2 := strconv.Atoi(m[2])
		if err1 != nil || err2 != nil {
			t.Errorf("%s: the range of %s, %s to %s, is not two integers", tb.Where(r), key, m[1], m[2])
			return
		}
		if lo > 0 {
			below = strconv.Itoa(lo - 1)
		}
		above = strconv.Itoa(hi + 1)
	default:
		return
	}
	parse := func(v string) error {
		_, err := ParsePolicies([]byte(fmt.Sprintf("defaults:\n  %s: %s\n", key, v)))
		return err
	}
	for _, v := range []string{m[1], m[2]} {
		if err := parse(v); err != nil {
			t.Errorf("%s: documents %s from %s to %s, but %s is refused: %v", tb.Where(r), key, m[1], m[2], v, err)
		}
	}
	for _, v := range []string{below, above} {
		if v != "" && parse(v) == nil {
			t.Errorf("%s: documents %s from %s to %s, but %s is accepted", tb.Where(r), key, m[1], m[2], v)
		}
	}
}

// TestPolicyExampleResolvesAsDocumented holds section 7 of
// docs/configuration.md to ParsePolicies: its YAML example names every
// field and parses, its JSON one parses, and the example resolves as the
// table "How it resolves" says (rule, effect, lease, attempts, retention,
// grace, tombstone and consequential fields).
func TestPolicyExampleResolvesAsDocumented(t *testing.T) {
	keys, _ := policyFieldKeys(t)
	const docName, section = "docs/configuration.md", "7. Complete example policy"
	d, err := mdtable.Read(docName)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := d.Section(section)
	if !ok {
		t.Fatalf("%s: no section %q", docName, section)
	}
	var example *Policies
	for _, b := range s.CodeBlocks() {
		if b.Info != "yaml" && b.Info != "json" {
			continue
		}
		p, err := ParsePolicies([]byte(b.Text))
		if err != nil {
			t.Errorf("%s:%d: the example policy (%s) is refused: %v", docName, b.Line, b.Info, err)
			continue
		}
		if b.Info != "yaml" || example != nil {
			continue
		}
		example = p
		for _, k := range keys {
			if !regexp.MustCompile(`(?m)^[\s-]*` + k + `:`).MatchString(b.Text) {
				t.Errorf("%s:%d: the complete example policy does not set %s", docName, b.Line, k)
			}
		}
	}
	if example == nil {
		t.Fatalf("%s, section %q: no YAML example that parses", docName, section)
	}

	tb, ok := s.TableWith("tenant", "tool", "rule", "effect", "lease", "max attempts", "retention", "consequential fields")
	if !ok {
		t.Fatalf("%s, section %q: no table of how the example resolves (columns tenant, tool, rule, effect, lease, max attempts, retention, consequential fields)", docName, section)
	}
	col := func(r mdtable.Row, name string) string { return r.Cell(tb.Column(name)) }
	var (
		firstWord = regexp.MustCompile(`^\S+`)
		grace     = regexp.MustCompile("`retain_until` \\+ (\\S+)")
		tombstone = regexp.MustCompile(`tombstone (\S+?)\)`)
	)
	type duration struct {
		name, doc string
		got       time.Duration
	}
	for _, r := range tb.Rows {
		tools := mdtable.CodeSpans(col(r, "tool"))
		tenants := mdtable.CodeSpans(col(r, "tenant"))
		if col(r, "tenant") == "any" {
			tenants = []string{"default", "acme-eu", "globex"}
		}
		if len(tools) != 1 || len(tenants) == 0 {
			t.Errorf("%s: a row names no tool and tenant (`name`, or any)", tb.Where(r))
			continue
		}
		for _, tenant := range tenants {
			got := example.For(tenant, tools[0])
			what := fmt.Sprintf("%s: tenant %s, tool %s:", tb.Where(r), tenant, tools[0])

			rule := "defaults"
			for i, pr := range example.rules {
				if match(pr.tool, tools[0]) && match(pr.tenant, tenant) {
					rule = strconv.Itoa(i + 1)
					break
				}
			}
			if docRule := firstWord.FindString(col(r, "rule")); docRule != rule {
				t.Errorf("%s the rule is documented as %s; it is %s", what, docRule, rule)
			}

			if doc := col(r, "effect"); doc != strings.ToLower(got.Effect.String()) {
				t.Errorf("%s the effect is documented as %s; it is %s", what, doc, strings.ToLower(got.Effect.String()))
			}
			if n, err := strconv.Atoi(col(r, "max attempts")); err != nil || n != got.MaxAttempts {
				t.Errorf("%s max attempts documented as %s; it is %d", what, col(r, "max attempts"), got.MaxAttempts)
			}
			durations := []duration{
				{"the lease", col(r, "lease"), got.Lease},
				{"the retention", firstWord.FindString(col(r, "retention")), got.Retention},
			}
			if m := grace.FindStringSubmatch(col(r, "retention")); m != nil {
				durations = append(durations, duration{"the grace after retain_until", m[1], got.RetainGrace})
			}
			if m := tombstone.FindStringSubmatch(col(r, "retention")); m != nil {
				durations = append(durations, duration{"the tombstone retention", m[1], got.TombstoneRetention})
			}
			for _, dur := range durations {
				if v, err := time.ParseDuration(dur.doc); err != nil || v != dur.got {
					t.Errorf("%s %s is documented as %s; it is %s", what, dur.name, dur.doc, dur.got)
				}
			}

			fields := mdtable.CodeSpans(col(r, "consequential fields"))
			if col(r, "consequential fields") == "all" {
				fields = nil
			}
			if !slices.Equal(fields, got.ConsequentialFields) {
				t.Errorf("%s the consequential fields are documented as %s; they are %q", what, col(r, "consequential fields"), got.ConsequentialFields)
			}
		}
	}
}

// TestParsePoliciesCommentExample: the example document of ParsePolicies's
// doc comment parses, and names every field of a policy.
func TestParsePoliciesCommentExample(t *testing.T) {
	keys, _ := policyFieldKeys(t)
	f, err := parser.ParseFile(token.NewFileSet(), "policy.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var example strings.Builder
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "ParsePolicies" || fn.Doc == nil {
			continue
		}
		// The indented lines of the comment are the document.
		for _, l := range strings.Split(fn.Doc.Text(), "\n") {
			if strings.HasPrefix(l, "\t") {
				example.WriteString(strings.TrimPrefix(l, "\t") + "\n")
			}
		}
	}
	if example.Len() == 0 {
		t.Fatal("ledger/policy.go: ParsePolicies's doc comment shows no example document")
	}
	if _, err := ParsePolicies([]byte(example.String())); err != nil {
		t.Errorf("ledger/policy.go: the example of ParsePolicies's doc comment is refused: %v\n%s", err, example.String())
	}
	for _, k := range keys {
		if !regexp.MustCompile(`(?m)^[\s-]*` + k + `:`).MatchString(example.String()) {
			t.Errorf("ledger/policy.go: the example of ParsePolicies's doc comment does not show %s", k)
		}
	}
}

// stripLuaComments returns src with its comments ("--" to the end of the
// line, outside string literals) blanked, line numbers kept.
func stripLuaComments(src string) string {
	var b strings.Builder
	quote := byte(0)
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case quote != 0:
			if c == '\\' && i+1 < len(src) {
				b.WriteByte(c)
				i++
				c = src[i]
			} else if c == quote || c == '\n' {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '-' && i+1 < len(src) && src[i+1] == '-':
			for i < len(src) && src[i] != '\n' {
				i++
			}
			if i < len(src) {
				b.WriteByte('\n')
			}
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

var (
	// luaReasons is one "NAME = 'L'" of common.lua's REASONS, or one
	// "L = 'NAME'" of its REASON_NAMES.
	luaReasons = regexp.MustCompile(`\b([A-Z_]+) = '([A-Z_]+)'`)
	// luaWrite is a call of transition(to, reason, ...) or
	// finish(to, reason, ...), the two writers of a history entry.
	luaWrite = regexp.MustCompile(`\b(transition|finish)\(\s*[^,()]+,\s*([^,()]+)`)
	// luaFunc is the header of a local function.
	luaFunc = regexp.MustCompile(`local function (\w+)\(([^)]*)\)`)
	// luaString is a string literal with no escapes.
	luaString = regexp.MustCompile(`^'([^'\\]*)'$|^"([^"\\]*)"$`)
)

// writtenReasons reads the scripts and returns, by script file name, the
// history reasons each one can write: the reason given to transition or
// finish as a string literal, or as a parameter of the local function the
// call is in, given as a literal by each call of that function. It fails
// the test on a reason it cannot tell.
func writtenReasons(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob("scripts/*.lua")
	if err != nil {
		t.Fatal(err)
	}
	written := map[string][]string{}
	add := func(file, reason string) {
		if !slices.Contains(written[file], reason) {
			written[file] = append(written[file], reason)
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src := stripLuaComments(string(b))
		name := filepath.Base(f)
		line := func(off int) string {
			return "ledger/" + filepath.ToSlash(f) + ":" + strconv.Itoa(1+strings.Count(src[:off], "\n"))
		}
		for _, m := range luaWrite.FindAllStringSubmatchIndex(src, -1) {
			arg := strings.TrimSpace(src[m[4]:m[5]])
			if lit := luaString.FindStringSubmatch(arg); lit != nil {
				add(name, lit[1]+lit[2])
				continue
			}
			// A parameter of the enclosing local function: the reasons are
			// the literals its callers pass in that place.
			var fn []int
			for _, h := range luaFunc.FindAllStringSubmatchIndex(src[:m[0]], -1) {
				fn = h
			}
			param := -1
			if fn != nil {
				for i, p := range strings.Split(src[fn[4]:fn[5]], ",") {
					if strings.TrimSpace(p) == arg {
						param = i
					}
				}
			}
			if param < 0 {
				t.Errorf("%s: %s writes the reason %s, neither a string literal nor a parameter of a local function", line(m[0]), src[m[2]:m[3]], arg)
				continue
			}
			fname := src[fn[2]:fn[3]]
			calls := regexp.MustCompile(`\b`+regexp.QuoteMeta(fname)+`\(([^()]*)\)`).FindAllStringSubmatchIndex(src, -1)
			for _, c := range calls {
				if c[0] == fn[0]+len("local function ") {
					continue // the function's own header
				}
				args := strings.Split(src[c[2]:c[3]], ",")
				var lit []string
				if param < len(args) {
					lit = luaString.FindStringSubmatch(strings.TrimSpace(args[param]))
				}
				if lit == nil {
					t.Errorf("%s: %s passes a reason that is not a string literal", line(c[0]), fname)
					continue
				}
				add(name, lit[1]+lit[2])
			}
		}
	}
	// reserve.lua writes a new record as ledgerd encodes it (newRecord.tail).
	o, hist, err := decodeRecord("L" + strings.Repeat("f", 32) + "2\xff\xff00000000" + newRecord{}.tail())
	if err != nil {
		t.Fatalf("ledger/record.go: newRecord.tail: %v", err)
	}
	entries := parseHistory(hist, o.CreatedAt)
	if len(entries) != 1 || entries[0].Reason != o.Reason {
		t.Fatalf("ledger/record.go: newRecord.tail writes the history %v, reason %s", entries, o.Reason)
	}
	add("reserve.lua", o.Reason)
	if len(written) == 0 {
		t.Fatal("ledger: the scripts write no history reason")
	}
	return written
}

// protoReasons returns the reasons the comment of HistoryEntry.reason in
// ledger.proto lists ("Why: RESERVED, CLAIMED, ... or ESCALATED."), and
// where the comment is.
func protoReasons(t *testing.T) ([]string, string) {
	t.Helper()
	const name = "proto/ledger/v1/ledger.proto"
	b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	inEntry := false
	for i, l := range lines {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "message HistoryEntry "):
			inEntry = true
		case inEntry && l == "}":
			inEntry = false
		case inEntry && regexp.MustCompile(`^string\s+reason\s*=`).MatchString(l):
			var comment []string
			j := i - 1
			for ; j >= 0 && strings.HasPrefix(strings.TrimSpace(lines[j]), "//"); j-- {
				comment = append([]string{strings.TrimPrefix(strings.TrimSpace(lines[j]), "//")}, comment...)
			}
			text := strings.Join(comment, " ")
			_, list, ok := strings.Cut(text, "Why:")
			if !ok {
				t.Fatalf("%s:%d: the comment of HistoryEntry.reason lists no reasons (\"Why: ...\")", name, j+2)
			}
			return regexp.MustCompile(`\b[A-Z][A-Z_]+\b`).FindAllString(list, -1), name + ":" + strconv.Itoa(j+2)
		}
	}
	t.Fatalf("%s: no field reason in message HistoryEntry", name)
	return nil, ""
}

// TestHistoryReasonsMatchScripts holds the history reasons together: the
// letters common.lua's REASONS stores them as and record.go's reasonNames
// reads them by, the reasons the scripts write, the table "History reasons"
// of docs/design.md, the history columns of its transition tables (each
// table the reasons its script writes) and the comment of
// HistoryEntry.reason in ledger.proto.
func TestHistoryReasonsMatchScripts(t *testing.T) {
	written := writtenReasons(t)
	all := map[string]bool{}
	for _, rs := range written {
		for _, r := range rs {
			all[r] = true
		}
	}

	// The letters.
	common, err := os.ReadFile("scripts/common.lua")
	if err != nil {
		t.Fatal(err)
	}
	def := regexp.MustCompile(`(?s)local REASONS = (.*?)\n-- REASON_NAMES.*?\nlocal REASON_NAMES = (.*?)\n\n`).FindSubmatch(common)
	if def == nil {
		t.Fatal("ledger/scripts/common.lua: no REASONS and REASON_NAMES")
	}
	letters := map[string]string{}
	for _, m := range luaReasons.FindAllStringSubmatch(string(def[1]), -1) {
		letters[m[1]] = m[2]
	}
	names := map[string]string{}
	for _, m := range luaReasons.FindAllStringSubmatch(string(def[2]), -1) {
		names[m[2]] = m[1]
	}
	if !maps.Equal(letters, names) {
		t.Errorf("ledger/scripts/common.lua: REASON_NAMES %v is not REASONS %v the other way round", names, letters)
	}
	for name, l := range letters {
		i := int(l[0] - 'A')
		switch {
		case i >= len(reasonNames) || reasonNames[i] != name:
			t.Errorf("ledger/scripts/common.lua stores %s as %s; record.go's reasonNames reads %s as %q", name, l, l, reasonName(l))
		case !all[name]:
			t.Errorf("ledger/scripts/common.lua defines the reason %s, which no script writes", name)
		}
	}
	for i, name := range reasonNames {
		if letters[name] != string(rune('A'+i)) {
			t.Errorf("ledger/record.go reads %c as %s; common.lua's REASONS stores %s as %q", 'A'+i, name, name, letters[name])
		}
	}
	for _, r := range slices.Sorted(maps.Keys(all)) {
		if _, ok := letters[r]; !ok {
			t.Errorf("ledger/scripts: a script writes the reason %s, which common.lua's REASONS does not define", r)
		}
	}

	// The table of reasons.
	const docName = "docs/design.md"
	d, err := mdtable.Read(docName)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := d.Section("History reasons")
	if !ok {
		t.Fatalf("%s: no section \"History reasons\"", docName)
	}
	tb, ok := s.TableWith("reason")
	if !ok {
		t.Fatalf("%s, section \"History reasons\": no table with a column reason", docName)
	}
	documented := map[string]bool{}
	for _, r := range tb.Rows {
		reason := strings.Trim(r.Cell(tb.Column("reason")), "` ")
		documented[reason] = true
		if !all[reason] {
			t.Errorf("%s: documents the history reason %s, which no script writes", tb.Where(r), reason)
		}
	}
	for _, r := range slices.Sorted(maps.Keys(all)) {
		if !documented[r] {
			t.Errorf("%s: the table of history reasons (line %d) does not list %s (written by %s)", docName, tb.Line, r, strings.Join(scriptsWriting(written, r), ", "))
		}
	}

	// The transition tables: under each heading that names a script, the
	// history column names the reasons that script writes.
	tt, ok := d.Section("3.3 Transition tables")
	if !ok {
		t.Fatalf("%s: no section \"3.3 Transition tables\"", docName)
	}
	for _, h := range tt.Headings()[1:] {
		var script string
		for _, c := range mdtable.CodeSpans(h) {
			if strings.HasSuffix(c, ".lua") {
				script = c
			}
		}
		if script == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join("scripts", script)); err != nil {
			t.Errorf("%s: the heading %q names %s, which is not a script", docName, h, script)
			continue
		}
		sub, _ := d.Section(h)
		named := map[string]bool{}
		for _, ttb := range sub.Tables() {
			col := -1
			for i, c := range ttb.Header {
				if strings.HasPrefix(strings.ToLower(c), "history reason") {
					col = i
				}
			}
			if col < 0 {
				continue
			}
			for _, r := range ttb.Rows {
				cell := strings.TrimSpace(r.Cell(col))
				if cell == "—" || cell == "-" {
					continue
				}
				reason := strings.Trim(strings.FieldsFunc(cell, func(c rune) bool { return c == ' ' || c == ',' || c == '(' })[0], "`")
				named[reason] = true
				if !slices.Contains(written[script], reason) {
					t.Errorf("%s: the table of %s has the history reason %q, which %s does not write", ttb.Where(r), script, reason, script)
				}
			}
		}
		for _, r := range written[script] {
			if !named[r] {
				t.Errorf("%s: the tables under %q do not show the history reason %s, which %s writes", docName, h, r, script)
			}
		}
	}

	// The proto's comment.
	listed, where := protoReasons(t)
	for _, r := range listed {
		if !all[r] {
			t.Errorf("%s: the comment of HistoryEntry.reason lists %s, which no script writes", where, r)
		}
	}
	for _, r := range slices.Sorted(maps.Keys(all)) {
		if !slices.Contains(listed, r) {
			t.Errorf("%s: the comment of HistoryEntry.reason does not list %s", where, r)
		}
	}
}

// scriptsWriting returns the scripts that write reason, sorted.
func scriptsWriting(written map[string][]string, reason string) []string {
	var files []string
	for f, rs := range written {
		if slices.Contains(rs, reason) {
			files = append(files, f)
		}
	}
	slices.Sort(files)
	return files
}
