package main

import (
	"flag"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/mdtable"
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
