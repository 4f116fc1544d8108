package client_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/mdtable"
)

// goSnippetDocs names, for each page with Go snippets, the example file
// whose Example functions hold them.
var goSnippetDocs = []struct{ doc, examples string }{
	{"docs/client.md", "client/example_test.go"},
	{"docs/agent.md", "client/agent/example_test.go"},
	{"examples/appointment/README.md", "client/agent/example_test.go"},
}

// snippetLines are the lines of Go source as the comparison sees them:
// each with its runs of spaces and tabs made one space (gofmt aligns
// comments and fields its own way), and without empty lines.
func snippetLines(src string) []string {
	var out []string
	for _, l := range strings.Split(src, "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// exampleBodies returns the body of every Example function of the Go file
// at path (relative to the repository's root), as snippetLines.
func exampleBodies(t *testing.T, root, path string) map[string][]string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string][]string{}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Recv != nil || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Example") {
			continue
		}
		from, to := fset.Position(fn.Body.Lbrace).Offset+1, fset.Position(fn.Body.Rbrace).Offset
		bodies[fn.Name.Name] = snippetLines(string(src[from:to]))
	}
	if len(bodies) == 0 {
		t.Fatalf("%s: no Example functions", path)
	}
	return bodies
}

// contains reports whether want is a run of consecutive lines of have.
func contains(have, want []string) bool {
	for i := 0; i+len(want) <= len(have); i++ {
		match := true
		for j := range want {
			if have[i+j] != want[j] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// TestDocsGoSnippetsAreExamples holds the Go snippets of the SDK's pages to
// code that compiles: every ```go block of docs/client.md, docs/agent.md
// and examples/appointment/README.md is, line for line, in the body of an
// Example function of the package it shows (client/example_test.go,
// client/agent/example_test.go), which go vet and go test compile. A
// snippet that an API change breaks fails to build there; one edited in
// the page alone fails here.
func TestDocsGoSnippetsAreExamples(t *testing.T) {
	root, err := mdtable.Root()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range goSnippetDocs {
		d, err := mdtable.Read(g.doc)
		if err != nil {
			t.Fatal(err)
		}
		bodies := exampleBodies(t, root, g.examples)
		n := 0
		for _, b := range d.All().CodeBlocks() {
			if b.Info != "go" {
				continue
			}
			n++
			want := snippetLines(b.Text)
			found := false
			for _, body := range bodies {
				if contains(body, want) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s:%d: this Go snippet is in no Example function of %s: put it there as it is (or change both), so that it compiles:\n%s",
					g.doc, b.Line, g.examples, b.Text)
			}
		}
		if n == 0 {
			t.Errorf("%s: no ```go snippet: drop it from goSnippetDocs", g.doc)
		}
	}
}
