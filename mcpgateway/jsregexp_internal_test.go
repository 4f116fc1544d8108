package mcpgateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// jsRegexpRows: patterns as the TypeScript client reads them (JavaScript
// with the u flag). A pattern JavaScript compiles, the gateway compiles
// too unless Go cannot match it alike (a lookaround, a back reference, a
// lone surrogate, a count over 1000) or Python's re cannot read it alike
// (a named group, a property, \u{...}, \c, an empty class, a surrogate
// pair): then the tool is served without its schema, as for a pattern
// JavaScript refuses. A value is matched as JavaScript matches it.
var jsRegexpRows = []struct {
	pattern  string
	value    *string // matched when set
	js       bool    // JavaScript compiles it
	gateway  bool    // the gateway compiles it
	matches  bool
	stricter bool // JavaScript matches the value, the gateway does not (Python's re may not)
}{
	{pattern: `^[a-z]+$`, value: ptr("abc"), js: true, gateway: true, matches: true},
	{pattern: `^[a-z]+$`, value: ptr("\u212a"), js: true, gateway: true},
	{pattern: `^\d{3}-\d{4}$`, value: ptr("555-1234"), js: true, gateway: true, matches: true},
	{pattern: `^\d$`, value: ptr("٣"), js: true, gateway: true},
	{pattern: `a|b`, value: ptr("b"), js: true, gateway: true, matches: true},
	{pattern: `^(a)(?:b)(\d{4})$`, value: ptr("ab2024"), js: true, gateway: true, matches: true},
	{pattern: `^.$`, value: ptr("a"), js: true, gateway: true, matches: true},
	{pattern: `^.$`, value: ptr("\r"), js: true, gateway: true},
	{pattern: `^.$`, value: ptr("\u2028"), js: true, gateway: true},
	{pattern: `^\s$`, value: ptr("\u00a0"), js: true, gateway: true, matches: true},
	{pattern: `^\S+$`, value: ptr("a\u00a0b"), js: true, gateway: true},
	{pattern: `^\S+$`, value: ptr("ab"), js: true, gateway: true, matches: true},
	{pattern: `^[^\s]$`, value: ptr("\u3000"), js: true, gateway: true},
	{pattern: `^[\S]$`, value: ptr("x"), js: true, gateway: true, matches: true},
	{pattern: `^[\s\S]$`, value: ptr("\n"), js: true, gateway: true, matches: true},
	{pattern: `^\u0041\x42😀$`, value: ptr("AB😀"), js: true, gateway: true, matches: true},
	{pattern: `^\n\0[\b]$`, value: ptr("\n\x00\b"), js: true, gateway: true, matches: true},
	{pattern: `^[\-a][a-][-a]\/\.$`, value: ptr("-a-/."), js: true, gateway: true, matches: true},
	{pattern: `^a{2,3}?b{2,}$`, value: ptr("aabbb"), js: true, gateway: true, matches: true},
	{pattern: `^\D$`, value: ptr("٣"), js: true, gateway: true, stricter: true},
	{pattern: `^[^\d]$`, value: ptr("٣"), js: true, gateway: true, stricter: true},
	{pattern: `^\D$`, value: ptr("x"), js: true, gateway: true, matches: true},
	{pattern: `^\w$`, value: ptr("é"), js: true, gateway: true},
	{pattern: `^\W$`, value: ptr("é"), js: true, gateway: true, stricter: true},
	{pattern: `^[^\w]$`, value: ptr("é"), js: true, gateway: true, stricter: true},
	{pattern: `^\W$`, value: ptr("-"), js: true, gateway: true, matches: true},
	{pattern: `^\S$`, value: ptr("\x1c"), js: true, gateway: true, stricter: true},
	{pattern: `^[\S]$`, value: ptr("\u0085"), js: true, gateway: true, stricter: true},
	{pattern: `^[^\s]$`, value: ptr("\x1c"), js: true, gateway: true, stricter: true},
	{pattern: `^\s$`, value: ptr("\ufeff"), js: true, gateway: true, stricter: true},
	{pattern: `^[\s\S]$`, value: ptr("\x1c"), js: true, gateway: true, stricter: true},
	{pattern: `^[^\W]$`, value: ptr("a"), js: true, gateway: true, matches: true},
	{pattern: `^[\d-]$`, value: ptr("-"), js: true, gateway: true, matches: true},
	{pattern: `^$`, value: ptr(""), js: true, gateway: true, matches: true},

	{pattern: `^a\-b$`},
	{pattern: `(?i)a`},
	{pattern: `(?P<n>a)`},
	{pattern: `[[:alpha:]]`},
	{pattern: `a{2,1}`},
	{pattern: `\p{Greek}`},
	{pattern: `\pL`},
	{pattern: `(?<a>x)(?<a>y)`},
	{pattern: `a]`},
	{pattern: `a}`},
	{pattern: `{`},
	{pattern: `*a`},
	{pattern: `a**`},
	{pattern: `^*`},
	{pattern: `(a`},
	{pattern: `a)`},
	{pattern: `\c1`},
	{pattern: `\01`},
	{pattern: `[z-a]`},
	{pattern: `[\d-z]`},
	{pattern: `\x4`},
	{pattern: `\u{110000}`},
	{pattern: `\q`},
	{pattern: `\A`},
	{pattern: `\z`},
	{pattern: `a\`},
	{pattern: `[a`},

	{pattern: `(?=a)a`, js: true},
	{pattern: `(?!b)a`, js: true},
	{pattern: `(?<=a)b`, js: true},
	{pattern: `(a)\1`, js: true},
	{pattern: `(?<n>a)\k<n>`, js: true},
	{pattern: `\bword\b`, js: true},
	{pattern: `[\Wa]`, js: true},
	{pattern: `^(?<year>\d{4})$`, js: true},
	{pattern: `[^]`, js: true},
	{pattern: `[]`, js: true},
	{pattern: `\u{1F600}`, js: true},
	{pattern: `\uD83D\uDE00`, js: true},
	{pattern: `\cJ`, js: true},
	{pattern: `\p{Lu}\P{N}[\p{L}]`, js: true},
	{pattern: `\uD83D`, js: true},
	{pattern: `a{1001}`, js: true},
}

func ptr(s string) *string { return &s }

// TestJSRegexp: each row as the gateway reads it; with node and
// examples/mcp/node installed, as JavaScript reads it too; and every
// pattern the gateway compiles, Python's re compiles, matching what the
// gateway matches (both required with LEDGER_TEST_POLYGLOT=require).
func TestJSRegexp(t *testing.T) {
	for _, r := range jsRegexpRows {
		re, err := jsRegexp(r.pattern)
		if (err == nil) != r.gateway || r.js && !r.gateway && !errors.Is(err, errNotMatchedAlike) && !errors.Is(err, errNotPortable) {
			t.Errorf("%s: compiles %v (%v), want %v", r.pattern, err == nil, err, r.gateway)
			continue
		}
		if r.value != nil && re.MatchString(*r.value) != r.matches {
			t.Errorf("%s on %q: matches %v, want %v", r.pattern, *r.value, !r.matches, r.matches)
		}
	}

	type row struct {
		Pattern string  `json:"pattern"`
		Value   *string `json:"value,omitempty"`
	}
	var in []row
	for _, r := range jsRegexpRows {
		in = append(in, row{r.pattern, r.value})
	}
	var verdicts []struct{ Compiles, Matches bool }
	runClient(t, "client_regexps.mjs", in, &verdicts)
	if len(verdicts) != len(jsRegexpRows) {
		t.Fatalf("client_regexps.mjs gave %d verdicts for %d rows", len(verdicts), len(jsRegexpRows))
	}
	for i, r := range jsRegexpRows {
		if v := verdicts[i]; v.Compiles != r.js || v.Matches != (r.matches || r.stricter) {
			t.Errorf("%s: JavaScript compiles %v and matches %v, the row %v and %v (stricter: %v)", r.pattern, v.Compiles, v.Matches, r.js, r.matches, r.stricter)
		}
	}

	var python []struct{ Compiles, Matches bool }
	runPython(t, "python_regexps.py", in, &python)
	if len(python) != len(jsRegexpRows) {
		t.Fatalf("python_regexps.py gave %d verdicts for %d rows", len(python), len(jsRegexpRows))
	}
	for i, r := range jsRegexpRows {
		if v := python[i]; r.gateway && !v.Compiles || r.matches && !v.Matches {
			t.Errorf("%s: Python's re compiles it %v and matches %v; the row %v (stricter: %v)", r.pattern, v.Compiles, v.Matches, r.matches, r.stricter)
		}
	}
}

// FuzzJSRegexp: no pattern makes the translation panic, and what it
// compiles is a valid Go expression.
func FuzzJSRegexp(f *testing.F) {
	for _, r := range jsRegexpRows {
		f.Add(r.pattern)
	}
	f.Fuzz(func(t *testing.T, p string) {
		_, _ = jsRegexp(p)
	})
}

// runClient runs script, of testdata, with in as its JSON input, in the
// directory of the official TypeScript client's packages, and decodes its
// output into out. It skips when node or the packages are missing, unless
// LEDGER_TEST_POLYGLOT=require.
func runClient(t *testing.T, script string, in, out any) {
	t.Helper()
	node, err := exec.LookPath("node")
	dir := filepath.Join("..", "examples", "mcp", "node")
	if _, serr := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil || serr != nil {
		needed(t, "node or examples/mcp/node/node_modules is missing (npm ci --prefix examples/mcp/node)")
	}
	src, err := os.ReadFile(filepath.Join("testdata", script))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, "--input-type=module", "-e", string(src))
	cmd.Dir = dir
	runJSON(t, script, cmd, in, out)
}

// runPython runs script, of testdata, with the system Python and in as its
// JSON input, and decodes its output into out. It skips when that Python
// cannot import jsonschema, unless LEDGER_TEST_POLYGLOT=require.
func runPython(t *testing.T, script string, in, out any) {
	t.Helper()
	const python = "/usr/bin/python3"
	if exec.Command(python, "-s", "-c", "import jsonschema").Run() != nil {
		needed(t, "/usr/bin/python3 cannot import jsonschema (scripts/ensure-python-grpc.sh installs it)")
	}
	runJSON(t, script, exec.Command(python, "-s", filepath.Join("testdata", script)), in, out)
}

// needed fails the test with LEDGER_TEST_POLYGLOT=require, which make test
// sets, and skips it otherwise: what is missing is a client to ask.
func needed(t *testing.T, missing string) {
	t.Helper()
	if os.Getenv("LEDGER_TEST_POLYGLOT") == "require" {
		t.Fatal(missing)
	}
	t.Skip(missing + ": the client's own verdicts are not checked")
}

// runJSON runs cmd, script's, with in as JSON on its stdin, and decodes
// what it prints into out.
func runJSON(t *testing.T, script string, cmd *exec.Cmd, in, out any) {
	t.Helper()
	b, _ := json.Marshal(in)
	cmd.Stdin = bytes.NewReader(b)
	printed, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	if err := json.Unmarshal(printed, out); err != nil {
		t.Fatalf("%s printed %q: %v", script, printed, err)
	}
}
