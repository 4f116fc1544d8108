package polyglot

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/mdtable"
)

// testName is a code span that names a test function: `TestX`, `FuzzX`,
// `ExampleX` or `BenchmarkX`.
var testName = regexp.MustCompile(`^(Test|Fuzz|Example|Benchmark)[A-Z_][A-Za-z0-9_]*$`)

// testFile is a code span that names a test file: `ledger/ledger_test.go`.
var testFile = regexp.MustCompile(`^[a-z0-9_./-]+_test\.go$`)

// TestDocsNameExistingTests: the documentation (README.md, docs/*.md, the
// examples' READMEs) cites its evidence by test file (a code span such as
// `metrics/metrics_test.go`) or scenario id, never by test function, so a
// test can be renamed freely; every file cited exists. Fuzz targets and
// benchmarks are named, since they are what -fuzz and -bench take: each
// is a function of a _test.go file.
func TestDocsNameExistingTests(t *testing.T) {
	root := repoRoot(t)
	defined := map[string]bool{}
	testFiles := map[string]bool{} // base names, for a doc that cites one as "next to" its code
	for path, funcs := range testFuncs(t, root) {
		testFiles[filepath.Base(path)] = true
		for _, name := range funcs {
			defined[name] = true
		}
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	examples, err := filepath.Glob(filepath.Join(root, "examples", "*", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, p := range append(append([]string{filepath.Join(root, "README.md")}, docs...), examples...) {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			t.Fatal(err)
		}
		d, err := mdtable.Read(filepath.ToSlash(rel))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range d.All().Spans() {
			switch {
			case testFile.MatchString(c.Text):
				named++
				at := filepath.Join(root, filepath.FromSlash(c.Text))
				if !strings.Contains(c.Text, "/") {
					at = filepath.Join(filepath.Dir(p), c.Text) // beside the doc
				}
				if _, err := os.Stat(at); err != nil && !(!strings.Contains(c.Text, "/") && testFiles[c.Text]) {
					t.Errorf("%s: cites %s, which is not a file of the repository", c.Where, c.Text)
				}
			case strings.HasPrefix(c.Text, "Test") && testName.MatchString(c.Text):
				t.Errorf("%s: names the test %s: cite its file instead", c.Where, c.Text)
			case testName.MatchString(c.Text):
				named++
				if !defined[c.Text] {
					t.Errorf("%s: names %s, which no _test.go file defines", c.Where, c.Text)
				}
			}
		}
	}
	if named == 0 {
		t.Fatal("the documentation names no test: the parser or the docs changed")
	}
}

// testFuncs returns the top-level functions of every _test.go file under
// root (outside hidden directories, node_modules and testdata), by the
// file's path relative to root, with '/' separators.
func testFuncs(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && path != root && (strings.HasPrefix(e.Name(), ".") || e.Name() == "node_modules" || e.Name() == "testdata") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(e.Name(), "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		var names []string
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil {
				names = append(names, fn.Name.Name)
			}
		}
		out[filepath.ToSlash(rel)] = names
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
