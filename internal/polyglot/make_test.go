package polyglot

import (
	"os"
	"path"
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
	for file, funcs := range testFuncs(t, root) {
		for _, name := range funcs {
			if strings.HasPrefix(name, "Fuzz") {
				defined = append(defined, path.Dir(file)+":"+name)
			}
		}
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
