package main

import (
	"bytes"
	"flag"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/mdtable"
	"github.com/opledger/ledger/receipt"
)

// ledgerdFlag is one of ledgerd's flags as the code defines it.
type ledgerdFlag struct {
	env string // the environment variable it falls back to
	def string // its default with no environment variable set
}

var envInUsage = regexp.MustCompile(`\[(LEDGER_[A-Z0-9_]+)\]$`)

// ledgerdFlags returns ledgerd's flags by name, with the environment
// variable each one's usage names and its default, with every LEDGER_*
// variable unset (restored when the test ends). It checks that each
// variable named is the one the flag reads: set, it is the flag's default.
func ledgerdFlags(t *testing.T) map[string]ledgerdFlag {
	t.Helper()
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "LEDGER_") {
			t.Setenv(name, "") // restores it when the test ends
			os.Unsetenv(name)
		}
	}
	defs := func() map[string]*flag.Flag {
		fs, _ := newFlagSet(&config{}, io.Discard)
		m := map[string]*flag.Flag{}
		fs.VisitAll(func(f *flag.Flag) { m[f.Name] = f })
		return m
	}
	flags := map[string]ledgerdFlag{}
	for name, f := range defs() {
		m := envInUsage.FindStringSubmatch(f.Usage)
		if m == nil {
			t.Errorf("cmd/ledgerd: the usage of --%s names no environment variable at its end ([LEDGER_...])", name)
			continue
		}
		flags[name] = ledgerdFlag{env: m[1], def: f.DefValue}
	}
	for name, f := range flags {
		val := "7"
		if _, ok := defs()[name].Value.(interface{ IsBoolFlag() bool }); ok {
			val = strconv.FormatBool(f.def != "true")
		}
		t.Setenv(f.env, val)
		if got := defs()[name].DefValue; got != val {
			t.Errorf("cmd/ledgerd: --%s's usage names %s, but with %s=%s its default is %q", name, f.env, f.env, val, got)
		}
		os.Unsetenv(f.env)
	}
	if len(flags) == 0 {
		t.Fatal("cmd/ledgerd: no flags found")
	}
	return flags
}

// TestConfigurationDocsMatchFlags holds the flag tables of
// docs/configuration.md (every flag) and README.md (the main ones) to
// ledgerd's flags: every flag documented with its environment variable and
// default, and nothing documented that does not exist.
func TestConfigurationDocsMatchFlags(t *testing.T) {
	flags := ledgerdFlags(t)
	for _, c := range []struct {
		doc, section string
		every        bool // every flag must be in the table
	}{
		{"docs/configuration.md", "2. Flags and environment variables", true},
		{"README.md", "Configuration", false},
	} {
		d, err := mdtable.Read(c.doc)
		if err != nil {
			t.Fatal(err)
		}
		s, ok := d.Section(c.section)
		if !ok {
			t.Errorf("%s: no section %q (the table of ledgerd's flags)", c.doc, c.section)
			continue
		}
		tb, ok := s.TableWith("flag", "environment", "default")
		if !ok {
			t.Errorf("%s, section %q: no table with columns flag, environment and default", c.doc, c.section)
			continue
		}
		documented := map[string]bool{}
		for _, r := range tb.Rows {
			names := mdtable.Flags(r.Cell(tb.Column("flag")))
			envs := mdtable.CodeSpans(r.Cell(tb.Column("environment")))
			if len(names) == 0 {
				t.Errorf("%s: a row of the flag table names no flag (`--name`)", tb.Where(r))
				continue
			}
			for i, name := range names {
				documented[name] = true
				f, ok := flags[name]
				if !ok {
					t.Errorf("%s: documents --%s, which ledgerd does not have", tb.Where(r), name)
					continue
				}
				switch {
				case len(envs) == len(names):
					if envs[i] != f.env {
						t.Errorf("%s: documents --%s with %s; its environment variable is %s", tb.Where(r), name, envs[i], f.env)
					}
				case len(envs) == 1 && strings.Contains(envs[0], "*"):
					if ok, _ := path.Match(envs[0], f.env); !ok {
						t.Errorf("%s: documents --%s with %s, which does not match its environment variable %s", tb.Where(r), name, envs[0], f.env)
					}
				default:
					t.Errorf("%s: documents --%s without its environment variable %s (one per flag, or one pattern such as LEDGER_TLS_*)", tb.Where(r), name, f.env)
				}
				if msg := mdtable.CheckDefault(r.Cell(tb.Column("default")), f.def); msg != "" {
					t.Errorf("%s: the default of --%s: %s", tb.Where(r), name, msg)
				}
			}
		}
		if c.every {
			for _, name := range sortedKeys(flags) {
				if !documented[name] {
					t.Errorf("%s: the flag table (line %d) does not document --%s (%s, default %q)", c.doc, tb.Line, name, flags[name].env, flags[name].def)
				}
			}
		}
	}
}

// commentFlag is a line of the package comment's flag list:
// "--name  LEDGER_NAME  what it does".
var commentFlag = regexp.MustCompile(`^\s*--([a-z0-9-]+)\s+(LEDGER_[A-Z0-9_]+)\s`)

// TestPackageCommentMatchesFlags holds the flag list of ledgerd's package
// comment (what go doc shows) to its flags and their environment variables.
func TestPackageCommentMatchesFlags(t *testing.T) {
	flags := ledgerdFlags(t)
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	if f.Doc == nil {
		t.Fatal("cmd/ledgerd/main.go has no package comment")
	}
	listed := map[string]bool{}
	for _, l := range strings.Split(f.Doc.Text(), "\n") {
		m := commentFlag.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		listed[m[1]] = true
		fl, ok := flags[m[1]]
		switch {
		case !ok:
			t.Errorf("cmd/ledgerd/main.go's package comment lists --%s, which ledgerd does not have", m[1])
		case fl.env != m[2]:
			t.Errorf("cmd/ledgerd/main.go's package comment lists --%s with %s; its environment variable is %s", m[1], m[2], fl.env)
		}
	}
	for _, name := range sortedKeys(flags) {
		if !listed[name] {
			t.Errorf("cmd/ledgerd/main.go's package comment does not list --%s (%s)", name, flags[name].env)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// keygenFlags returns the flags of "ledgerd keygen" by name.
func keygenFlags(t *testing.T) map[string]*flag.Flag {
	t.Helper()
	flags := map[string]*flag.Flag{}
	newKeygenFlagSet(&keygenOptions{}, io.Discard).VisitAll(func(f *flag.Flag) { flags[f.Name] = f })
	if len(flags) == 0 {
		t.Fatal("cmd/ledgerd: keygen has no flags")
	}
	return flags
}

// keygenArgs returns the arguments of a documented "ledgerd keygen ..."
// command line, and whether cmd is one.
func keygenArgs(cmd string) ([]string, bool) {
	fields := strings.Fields(cmd)
	if len(fields) < 2 || fields[0] != "ledgerd" || fields[1] != "keygen" {
		return nil, false
	}
	return fields[2:], true
}

// argFlags returns the names of the flags args gives ("--id x" and
// "--id=x" are "id").
func argFlags(args []string) []string {
	var names []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			names = append(names, name)
		}
	}
	return names
}

// withoutFlag returns args without the flag name and its value.
func withoutFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			out = append(out, a)
			continue
		}
		n, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if n != name {
			out = append(out, a)
			continue
		}
		if !hasValue {
			i++ // its value
		}
	}
	return out
}

// TestKeygenDocsMatchFlags holds the documentation of "ledgerd keygen" to
// its flags: the table of its section in docs/configuration.md documents
// every flag, with its default or as required (the section's example,
// which gives every flag, is accepted, and refused without a required
// one only); and every "ledgerd keygen ..." command line of README.md,
// docs/*.md and ledgerd's package comment names only its flags and is
// accepted.
func TestKeygenDocsMatchFlags(t *testing.T) {
	flags := keygenFlags(t)
	const docName, section = "docs/configuration.md", "`ledgerd keygen`"
	d, err := mdtable.Read(docName)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := d.Section(section)
	if !ok {
		t.Fatalf("%s: no section %q (the flags of ledgerd keygen)", docName, section)
	}
	tb, ok := s.TableWith("flag", "default")
	if !ok {
		t.Fatalf("%s, section %q: no table with columns flag and default", docName, section)
	}
	required := map[string]bool{}
	documented := map[string]bool{}
	for _, r := range tb.Rows {
		names := mdtable.Flags(r.Cell(tb.Column("flag")))
		if len(names) == 0 {
			t.Errorf("%s: a row of the flag table names no flag (`--name`)", tb.Where(r))
		}
		for _, name := range names {
			documented[name] = true
			f, ok := flags[name]
			if !ok {
				t.Errorf("%s: documents --%s, which ledgerd keygen does not have", tb.Where(r), name)
				continue
			}
			def := r.Cell(tb.Column("default"))
			if strings.EqualFold(strings.TrimSpace(def), "required") {
				required[name] = true
			} else if msg := mdtable.CheckDefault(def, f.DefValue); msg != "" {
				t.Errorf("%s: the default of --%s: %s", tb.Where(r), name, msg)
			}
		}
	}
	for _, name := range sortedKeys(flags) {
		if !documented[name] {
			t.Errorf("%s: the flag table of ledgerd keygen (line %d) does not document --%s (default %q)", docName, tb.Line, name, flags[name].DefValue)
		}
	}

	// --receipts makes a receipt key instead, with --id only: its example
	// prints a key file that loads.
	keyFlags := maps.Clone(flags)
	delete(keyFlags, "receipts")
	receiptExample := false
	for _, c := range s.Spans() {
		if args, ok := keygenArgs(c.Text); ok && slices.Contains(args, "--receipts") {
			var out bytes.Buffer
			if err := keygen(args, &out, io.Discard); err != nil {
				t.Errorf("%s: %v: %v", c.Where, args, err)
			} else if _, err := receipt.ParseJWK(out.Bytes()); err != nil {
				t.Errorf("%s: %v prints no key file: %v", c.Where, args, err)
			}
			receiptExample = true
		}
	}
	if !receiptExample {
		t.Errorf("%s, section %q: no example `ledgerd keygen --receipts ...`", docName, section)
	}

	// The section's example of an API key gives every other flag; without
	// each required one it is refused, without any other accepted.
	var example []string
	where := ""
	for _, c := range s.Spans() {
		if args, ok := keygenArgs(c.Text); ok && example == nil && len(argFlags(args)) == len(keyFlags) && !slices.Contains(args, "--receipts") {
			example, where = args, c.Where
		}
	}
	if example == nil {
		t.Fatalf("%s, section %q: no example `ledgerd keygen ...` that gives every flag", docName, section)
	}
	for _, name := range sortedKeys(keyFlags) {
		args := withoutFlag(example, name)
		err := keygen(args, io.Discard, io.Discard)
		switch {
		case required[name] && err == nil:
			t.Errorf("%s: --%s is documented as required, but keygen %v is accepted", where, name, args)
		case !required[name] && err != nil:
			t.Errorf("%s: --%s is documented with a default, but keygen %v is refused: %v", where, name, args, err)
		}
	}

	// Every command line, anywhere.
	root, err := mdtable.Root()
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []mdtable.Span
	for _, name := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		rel, _ := filepath.Rel(root, name)
		d, err := mdtable.Read(filepath.ToSlash(rel))
		if err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, d.All().Spans()...)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`"(ledgerd keygen[^"]*)"`).FindAllStringSubmatch(f.Doc.Text(), -1) {
		cmds = append(cmds, mdtable.Span{Text: m[1], Where: "cmd/ledgerd/main.go's package comment"})
	}
	found := 0
	for _, c := range cmds {
		args, ok := keygenArgs(c.Text)
		if !ok || len(args) == 0 {
			continue
		}
		found++
		unknown := false
		for _, name := range argFlags(args) {
			if _, ok := flags[name]; !ok && name != "h" && name != "help" { // -h: the flag package's own
				t.Errorf("%s: `%s` gives --%s, which ledgerd keygen does not have", c.Where, c.Text, name)
				unknown = true
			}
		}
		if err := keygen(args, io.Discard, io.Discard); err != nil && !unknown {
			t.Errorf("%s: `%s` is refused: %v", c.Where, c.Text, err)
		}
	}
	if found == 0 {
		t.Fatal("no `ledgerd keygen ...` command line found in the documentation")
	}
}
