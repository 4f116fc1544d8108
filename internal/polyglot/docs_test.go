package polyglot

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/mdtable"
)

// testName is a code span that names a test function: `TestX`, `FuzzX`,
// `ExampleX` or `BenchmarkX`.
var testName = regexp.MustCompile(`^(Test|Fuzz|Example|Benchmark)[A-Z_][A-Za-z0-9_]*$`)

// TestDocsNameExistingTests: every test the documentation names as its
// evidence (a code span such as `TestOverdueAlertRisesAndFalls` in
// README.md, docs/*.md or an example's README) is a function of a _test.go
// file, so that renaming or removing a test cannot leave the docs pointing
// at nothing.
func TestDocsNameExistingTests(t *testing.T) {
	root := repoRoot(t)
	defined := map[string]bool{}
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
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil {
				defined[fn.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
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
			if !testName.MatchString(c.Text) {
				continue
			}
			named++
			if !defined[c.Text] {
				t.Errorf("%s: names %s, which no _test.go file defines", c.Where, c.Text)
			}
		}
	}
	if named == 0 {
		t.Fatal("the documentation names no test: the parser or the docs changed")
	}
}
