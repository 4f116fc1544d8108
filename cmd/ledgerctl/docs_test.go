package main

import (
	"flag"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/mdtable"
)

// ledgerdFlagsInGuide are flags of ledgerd (not ledgerctl) that
// docs/ledgerctl.md names, to say what the ledger must be running with.
var ledgerdFlagsInGuide = map[string]bool{"auth-file": true, "listen": true, "http-listen": true}

// commandArgs are arguments that make a well-formed command line of each
// command, flags aside.
var commandArgs = map[string][]string{
	"lookup":          {"wf-1:step"},
	"list-unresolved": nil,
	"reconcile":       {"wf-1:step", "applied"},
	"get-run":         {"run-1"},
	"list-runs":       nil,
	"end-run":         {"run-1", "done"},
}

// flagEnvs returns, by flag, the environment variable ledgerctl reads as
// its default: a variable is the flag's when setting it to a value parses
// to the same options as giving the flag that value (but for addrFrom,
// which names where the address came from, to say so in BAD_ADDRESS).
func flagEnvs(t *testing.T) map[string]string {
	t.Helper()
	var names []string
	newOptions(func(k string) string { names = append(names, k); return "" })
	const val = "docs-check.example:443"
	envs := map[string]string{}
	for _, name := range names {
		found := false
		for _, cmd := range commands {
			base := append([]string{cmd}, commandArgs[cmd]...)
			fromEnv, _ := parse(base, func(k string) string {
				if k == name {
					return val
				}
				return ""
			})
			for _, f := range append(slices.Clone(globalFlags), commandFlags[cmd]...) {
				fromFlag, _ := parse(append(slices.Clone(base), "--"+f, val), func(string) string { return "" })
				fromEnv.addrFrom, fromFlag.addrFrom = "", ""
				if reflect.DeepEqual(fromEnv, fromFlag) {
					envs[f], found = name, true
				}
			}
		}
		if !found {
			t.Errorf("cmd/ledgerctl reads %s, but setting it matches no flag", name)
		}
	}
	return envs
}

// TestGuideMatchesCommandsAndFlags holds docs/ledgerctl.md to ledgerctl's
// commands and flags: every command in the table of commands and with a
// section of its own; the global flags in the table of "Connecting", with
// their environment variables and defaults; each command's flags in its
// section; and no flag named that ledgerctl does not have.
func TestGuideMatchesCommandsAndFlags(t *testing.T) {
	d, err := mdtable.Read("docs/ledgerctl.md")
	if err != nil {
		t.Fatal(err)
	}
	fs := newFlagSet(newOptions(func(string) string { return "" }))
	envs := flagEnvs(t)

	// Commands.
	tb, ok := d.All().TableWith("command")
	if !ok {
		t.Fatal("docs/ledgerctl.md: no table of commands (a column \"command\")")
	}
	documented := map[string]bool{}
	for _, r := range tb.Rows {
		spans := mdtable.CodeSpans(r.Cell(tb.Column("command")))
		fields := []string{}
		if len(spans) > 0 {
			fields = strings.Fields(spans[0])
		}
		if len(fields) < 2 || fields[0] != "ledgerctl" {
			t.Errorf("%s: a row of the table of commands shows no `ledgerctl COMMAND ...`", tb.Where(r))
			continue
		}
		documented[fields[1]] = true
		if !slices.Contains(commands, fields[1]) {
			t.Errorf("%s: documents the command %q, which ledgerctl does not have", tb.Where(r), fields[1])
		}
	}
	for _, c := range commands {
		if !documented[c] {
			t.Errorf("docs/ledgerctl.md: the table of commands (line %d) does not list %s", tb.Line, c)
		}
		if _, ok := d.Section(c); !ok {
			t.Errorf("docs/ledgerctl.md: no section \"## %s\" for the command %s", c, c)
		}
	}

	// Global flags.
	conn, ok := d.Section("Connecting")
	if !ok {
		t.Fatal("docs/ledgerctl.md: no section \"Connecting\" (the global flags)")
	}
	gt, ok := conn.TableWith("flag", "environment", "default")
	if !ok {
		t.Fatal("docs/ledgerctl.md, section Connecting: no table with columns flag, environment and default")
	}
	inTable := map[string]bool{}
	for _, r := range gt.Rows {
		names := mdtable.Flags(r.Cell(gt.Column("flag")))
		docEnvs := mdtable.CodeSpans(r.Cell(gt.Column("environment")))
		if len(names) == 0 {
			t.Errorf("%s: a row of the flag table names no flag (`--name`)", gt.Where(r))
		}
		for i, name := range names {
			inTable[name] = true
			f := fs.Lookup(name)
			if f == nil {
				t.Errorf("%s: documents --%s, which ledgerctl does not have", gt.Where(r), name)
				continue
			}
			if !slices.Contains(globalFlags, name) {
				t.Errorf("%s: documents --%s with the global flags; it is a flag of %s only", gt.Where(r), name, commandOf(name))
			}
			docEnv := ""
			if len(docEnvs) == len(names) {
				docEnv = docEnvs[i]
			} else if len(docEnvs) > 0 {
				t.Errorf("%s: %d flags with %d environment variables (one per flag)", gt.Where(r), len(names), len(docEnvs))
			}
			if docEnv != envs[name] {
				t.Errorf("%s: documents --%s with environment variable %q; ledgerctl reads %q", gt.Where(r), name, docEnv, envs[name])
			}
			if msg := mdtable.CheckDefault(r.Cell(gt.Column("default")), f.DefValue); msg != "" {
				t.Errorf("%s: the default of --%s: %s", gt.Where(r), name, msg)
			}
		}
	}
	for _, name := range globalFlags {
		if !inTable[name] {
			t.Errorf("docs/ledgerctl.md: the table of global flags (line %d) does not document --%s", gt.Line, name)
		}
	}

	// Each command's flags, in its section (which may name another's, as a
	// cross-reference); a flag table there lists the command's flags only.
	for _, cmd := range commands {
		s, ok := d.Section(cmd)
		if !ok {
			continue // reported above
		}
		lines, _ := s.Text()
		mentioned := map[string]bool{}
		for _, l := range lines {
			for _, name := range mdtable.Flags(l) {
				mentioned[name] = true
			}
		}
		for _, name := range commandFlags[cmd] {
			if !mentioned[name] {
				t.Errorf("docs/ledgerctl.md: the section of %s does not document its flag --%s", cmd, name)
			}
		}
		for _, ft := range s.Tables() {
			col := ft.Column("flag")
			if col < 0 {
				col = ft.Column("flags")
			}
			if col < 0 {
				continue
			}
			for _, r := range ft.Rows {
				for _, name := range mdtable.Flags(r.Cell(col)) {
					if !slices.Contains(commandFlags[cmd], name) {
						t.Errorf("%s: the flag table of %s lists --%s, which is not a flag of %s", ft.Where(r), cmd, name, cmd)
					}
				}
			}
		}
	}

	// No flag that does not exist, anywhere in the guide.
	lines, numbers := d.All().Text()
	for i, l := range lines {
		for _, name := range mdtable.Flags(l) {
			if fs.Lookup(name) == nil && !ledgerdFlagsInGuide[name] {
				t.Errorf("%s: names --%s, which ledgerctl does not have", d.All().Where(numbers[i]), name)
			}
		}
	}
}

// TestUsageMatchesFlags holds ledgerctl's own usage text to its commands
// and flags, and the flag set to globalFlags and commandFlags (a flag may
// belong to several commands, not to a command and the global flags).
func TestUsageMatchesFlags(t *testing.T) {
	fs := newFlagSet(newOptions(func(string) string { return "" }))
	listed := map[string]bool{}
	for _, name := range globalFlags {
		listed[name] = true
	}
	for _, cmd := range commands {
		for _, name := range commandFlags[cmd] {
			if slices.Contains(globalFlags, name) {
				t.Errorf("--%s is both a global flag and a flag of %s", name, cmd)
			}
			listed[name] = true
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !listed[f.Name] {
			t.Errorf("--%s is defined, but neither a global flag nor any command's: every command refuses it", f.Name)
		}
		delete(listed, f.Name)
	})
	for name := range listed {
		t.Errorf("--%s is in globalFlags or commandFlags but not defined", name)
	}
	whole := usage("")
	for _, cmd := range commands {
		if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(cmd) + `\b`).MatchString(whole) {
			t.Errorf("the usage does not list the command %s", cmd)
		}
		u := usage(cmd)
		for _, name := range append(slices.Clone(globalFlags), commandFlags[cmd]...) {
			if !regexp.MustCompile(`--` + regexp.QuoteMeta(name) + `([^a-z0-9-]|$)`).MatchString(u) {
				t.Errorf("the usage of %s does not show --%s", cmd, name)
			}
		}
	}
}

// commandOf names the command(s) a flag belongs to.
func commandOf(name string) string {
	var cmds []string
	for _, c := range commands {
		if slices.Contains(commandFlags[c], name) {
			cmds = append(cmds, c)
		}
	}
	if len(cmds) == 0 {
		return "no command"
	}
	return strings.Join(cmds, ", ")
}

// jsonNames returns the JSON names of v's fields (of its embedded structs
// too), in order.
func jsonNames(v any) []string {
	var names []string
	var walk func(reflect.Type)
	walk = func(ty reflect.Type) {
		for i := range ty.NumField() {
			f := ty.Field(i)
			tag, ok := f.Tag.Lookup("json")
			if f.Anonymous && !ok {
				walk(f.Type)
				continue
			}
			if name, _, _ := strings.Cut(tag, ","); name != "" && name != "-" {
				names = append(names, name)
			}
		}
	}
	walk(reflect.TypeOf(v))
	return names
}

// noticeConst is a notice code constant of output.go.
var noticeConst = regexp.MustCompile(`(?m)^\s*notice[A-Za-z]+\s*=\s*"([A-Z_]+)"`)

// TestGuideMatchesJSONOutput holds the section "JSON output" of
// docs/ledgerctl.md to what ledgerctl prints with --json: its table of
// fields names every field of the document lookup and reconcile print (and
// of each operation listed), with the members of history[], result,
// failure and notices[], and no other; its table of run fields does the
// same for get-run's; list-unresolved's and list-runs' documents are shown
// with every field they have; and its table of notices lists every notice
// code and no other.
func TestGuideMatchesJSONOutput(t *testing.T) {
	d, err := mdtable.Read("docs/ledgerctl.md")
	if err != nil {
		t.Fatal(err)
	}
	s, ok := d.Section("JSON output")
	if !ok {
		t.Fatal(`docs/ledgerctl.md: no section "JSON output"`)
	}
	lines, _ := s.Text()
	text := strings.Join(lines, "\n")
	checkFieldTable(t, s, "field", jsonDocument{}, map[string][]string{
		"history": jsonNames(jsonHistory{}),
		"result":  jsonNames(jsonResult{}),
		"failure": jsonNames(jsonFailure{}),
		"notices": jsonNames(jsonNotice{}),
	}, "ledgerctl --json")
	checkShown(t, text, jsonList{}, "list-unresolved")
	checkFieldTable(t, s, "run field", jsonRunDocument{}, map[string][]string{"limits": jsonNames(jsonRunLimits{})}, "get-run --json")
	checkShown(t, text, jsonRunList{}, "list-runs")

	// Notice codes.
	src, err := os.ReadFile("output.go")
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, m := range noticeConst.FindAllStringSubmatch(string(src), -1) {
		codes = append(codes, m[1])
	}
	if len(codes) == 0 {
		t.Fatal("cmd/ledgerctl/output.go: no notice code constants (notice... = \"CODE\")")
	}
	nt, ok := s.TableWith("`code`", "command")
	if !ok {
		t.Fatal(`docs/ledgerctl.md, section "JSON output": no table of notices (columns code, command)`)
	}
	listed := map[string]bool{}
	for _, r := range nt.Rows {
		for _, c := range mdtable.CodeSpans(r.Cell(nt.Column("`code`"))) {
			listed[c] = true
			if !slices.Contains(codes, c) {
				t.Errorf("%s: documents the notice %s, which ledgerctl does not give", nt.Where(r), c)
			}
		}
	}
	for _, c := range codes {
		if !listed[c] {
			t.Errorf("%s: the table of notices does not document %s", s.Where(nt.Line), c)
		}
	}
}

// checkFieldTable holds the table of s with the column col to the JSON
// document doc that command prints: col names every field of doc (as code
// spans; "[]" dropped) and no other, and the row of each field in members
// names its members in the next cell (as `name` or "name").
func checkFieldTable(t *testing.T, s mdtable.Section, col string, doc any, members map[string][]string, command string) {
	t.Helper()
	ft, ok := s.TableWith(col)
	if !ok {
		t.Fatalf(`docs/ledgerctl.md, section "JSON output": no table with a column %q`, col)
	}
	documented := map[string]bool{}
	for _, r := range ft.Rows {
		for _, field := range mdtable.CodeSpans(r.Cell(ft.Column(col))) {
			field = strings.TrimSuffix(field, "[]")
			documented[field] = true
			cell := r.Cell(ft.Column(col) + 1)
			for _, name := range members[field] {
				if !strings.Contains(cell, "`"+name+"`") && !strings.Contains(cell, `"`+name+`"`) {
					t.Errorf("%s: %s's row does not name its field %q", ft.Where(r), field, name)
				}
			}
		}
	}
	for _, name := range jsonNames(doc) {
		if !documented[name] {
			t.Errorf("%s: the table of %ss does not document %q, which %s prints", s.Where(ft.Line), col, name, command)
		}
		delete(documented, name)
	}
	for name := range documented {
		t.Errorf("%s: the table of %ss documents %q, which %s does not print", s.Where(ft.Line), col, name, command)
	}
}

// checkShown holds text to show command's JSON document doc with every
// field it has.
func checkShown(t *testing.T, text string, doc any, command string) {
	t.Helper()
	for _, name := range jsonNames(doc) {
		if !strings.Contains(text, `"`+name+`":`) {
			t.Errorf(`docs/ledgerctl.md, section "JSON output": %s's document is not shown with its field %q`, command, name)
		}
	}
}
