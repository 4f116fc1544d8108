package polyglot

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// fuzzTargets is the FUZZ_TARGETS variable of the Makefile, with its
// continuation lines.
var fuzzTargets = regexp.MustCompile(`(?m)^FUZZ_TARGETS :=((?:.*\\\n)*.*)$`)

// TestMakeFuzzRunsEveryTarget: make fuzz runs every fuzz target of the tree
// (FUZZ_TARGETS, as package:FuzzName), and names none that does not exist.
func TestMakeFuzzRunsEveryTarget(t *testing.T) {
	root := repoRoot(t)
	var defined []string
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
		dir, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Fuzz") {
				defined = append(defined, filepath.ToSlash(dir)+":"+fn.Name.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := fuzzTargets.FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile has no FUZZ_TARGETS")
	}
	listed := strings.Fields(strings.ReplaceAll(string(m[1]), "\\", " "))
	slices.Sort(defined)
	slices.Sort(listed)
	for _, d := range defined {
		if !slices.Contains(listed, d) {
			t.Errorf("FUZZ_TARGETS lacks %s: make fuzz does not run it", d)
		}
	}
	for _, l := range listed {
		if !slices.Contains(defined, l) {
			t.Errorf("FUZZ_TARGETS names %s, which no _test.go defines", l)
		}
	}
}
