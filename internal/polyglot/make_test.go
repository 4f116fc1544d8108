package polyglot

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
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

// TestCheckNPMOptional: after npm ci, make runs check-npm-optional.mjs,
// which fails, naming them, when optional packages this machine takes are
// missing (npm skips those it cannot fetch, and reports success), and
// passes over those of other platforms and what they depend on.
func TestCheckNPMOptional(t *testing.T) {
	node, err := exec.LookPath("node")
	need(t, err == nil, "node is not on PATH")
	script := filepath.Join(repoRoot(t), "scripts", "check-npm-optional.mjs")
	other := "aix"
	if runtime.GOOS == "aix" {
		other = "linux"
	}
	here := map[string]string{"linux": "linux", "darwin": "darwin", "windows": "win32"}[runtime.GOOS]
	for _, tc := range []struct {
		name      string
		packages  string // the lock file's packages besides the root
		installed []string
		missing   []string // named in the refusal; none: it passes
	}{
		{"installed", `"node_modules/a": {"optional": true}`, []string{"a"}, nil},
		{"missing", `"node_modules/a": {"optional": true}, "node_modules/b": {}`, []string{"b"}, []string{"a"}},
		{"another os's", `"node_modules/a": {"optional": true, "os": ["` + other + `"]}`, nil, nil},
		{"refused here", `"node_modules/a": {"optional": true, "os": ["!` + here + `"]}`, nil, nil},
		{"this os's", `"node_modules/@s/a-` + here + `": {"optional": true, "os": ["` + here + `"]}`, nil, []string{"@s/a-" + here}},
		{"under another os's", `"node_modules/a": {"optional": true, "os": ["` + other + `"]}, "node_modules/a/node_modules/b": {"optional": true}`, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			lock := `{"lockfileVersion": 3, "packages": {"": {}, ` + tc.packages + `}}`
			if err := os.WriteFile(filepath.Join(dir, "package-lock.json"), []byte(lock), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, p := range tc.installed {
				if err := os.MkdirAll(filepath.Join(dir, "node_modules", p), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			out, err := exec.Command(node, script, dir).CombinedOutput()
			if (err == nil) != (len(tc.missing) == 0) {
				t.Fatalf("check: %v\n%s", err, out)
			}
			for _, m := range tc.missing {
				if !strings.Contains(string(out), m) || !strings.Contains(string(out), "npm ci in "+dir+" left out") {
					t.Errorf("the refusal does not name %s: %s", m, out)
				}
			}
		})
	}
}
