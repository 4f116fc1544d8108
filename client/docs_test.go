package client_test

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/opledger/ledger/client"
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

// readsErr reports whether n reads a variable named err, outside the
// function literals in it (which have their own).
func readsErr(n ast.Node) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.Ident:
			found = found || n.Name == "err"
		}
		return !found
	})
	return found
}

// TestDocsGoSnippetsCheckErrors: no Go snippet of the SDK's pages drops an
// error by assigning err again before reading it (as "c, err :=
// client.Dial(...)" followed by "res, err := c.Do(...)" would: a reader
// who copies it calls Do on a nil Client when Dial failed). Each snippet's
// statements are read in order; a function literal's err is its own.
func TestDocsGoSnippetsCheckErrors(t *testing.T) {
	for _, g := range goSnippetDocs {
		d, err := mdtable.Read(g.doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range d.All().CodeBlocks() {
			if b.Info != "go" {
				continue
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+b.Text+"\n}\n", 0)
			if err != nil {
				t.Errorf("%s:%d: the Go snippet is no list of statements: %v", g.doc, b.Line, err)
				continue
			}
			line := func(n ast.Node) int { return b.Line + fset.Position(n.Pos()).Line - 2 }
			var unread ast.Node // the statement whose err is not read yet
			for _, st := range f.Decls[0].(*ast.FuncDecl).Body.List {
				as, ok := st.(*ast.AssignStmt)
				if !ok {
					if readsErr(st) {
						unread = nil
					}
					continue
				}
				for _, r := range as.Rhs {
					if readsErr(r) {
						unread = nil
					}
				}
				for _, l := range as.Lhs {
					if id, ok := l.(*ast.Ident); ok && id.Name == "err" {
						if unread != nil {
							t.Errorf("%s:%d: the error assigned on line %d is not checked before err is assigned again here: check it (and change the Example function too)",
								g.doc, line(as), line(unread))
						}
						unread = as
					}
				}
			}
		}
	}
}

// codeName is a gRPC code as the docs write it: INVALID_ARGUMENT.
func codeName(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

var (
	// httpRange is "4xx (but 408/425/429)": a class of statuses but some.
	httpRange = regexp.MustCompile(`\b([1-5])xx \(but ([0-9/]+)\)`)
	// httpStatus is a status the table names: HTTP 500/502/503/504.
	httpStatus = regexp.MustCompile(`\b[1-5][0-9][0-9]\b`)
	// upperWord is a word that may name a gRPC code.
	upperWord = regexp.MustCompile(`\b[A-Z][A-Z_]+[A-Z]\b`)
)

// TestDocsClassesMatchClassifiers holds the table "How fn ended → what the
// ledger records" of docs/client.md to ClassOf, ClassifyHTTP and
// ClassifyGRPC: every HTTP status and gRPC code a row names (and its
// markers, a refused connection, a timeout, a canceled context, an
// unmarked error) has the row's class, and every status and code no row
// names is ambiguous, as "any unmarked error" says. A status the table
// calls retryable that is not proven "not applied" would run an effect
// twice.
func TestDocsClassesMatchClassifiers(t *testing.T) {
	d, err := mdtable.Read("docs/client.md")
	if err != nil {
		t.Fatal(err)
	}
	sec, ok := d.Section("How fn ended → what the ledger records")
	if !ok {
		t.Fatal("docs/client.md: no section \"How fn ended → what the ledger records\"")
	}
	tb, ok := sec.TableWith("fn returned", "class")
	if !ok {
		t.Fatal("docs/client.md: the section How fn ended has no table with columns \"fn returned\" and \"class\"")
	}
	grpcCodes := map[string]codes.Code{}
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		grpcCodes[codeName(c)] = c
	}
	cause := errors.New("the destination's error")
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	markers := map[string]error{
		"`MarkFinal`":        client.MarkFinal("declined", cause),
		"`MarkRetryable`":    client.MarkRetryable(cause),
		"connection refused": refused,
		"a timeout":          context.DeadlineExceeded,
		"a canceled context": context.Canceled,
		"any unmarked error": cause,
	}
	namedHTTP, namedGRPC := map[int]bool{}, map[codes.Code]bool{}
	rows := 0
	for _, r := range tb.Rows {
		class, _, _ := strings.Cut(strings.TrimSpace(r.Cell(tb.Column("class"))), ":")
		if class != "final" && class != "retryable" && class != "ambiguous" {
			continue // a result, a panic: no class
		}
		rows++
		cell := r.Cell(tb.Column("fn returned"))
		check := func(what string, err error) {
			t.Helper()
			if got := client.ClassOf(err).String(); got != class {
				t.Errorf("%s: %s is %s, the table says %s", tb.Where(r), what, got, class)
			}
		}
		for m, err := range markers {
			if strings.Contains(cell, m) {
				check(m, err)
			}
		}
		for _, g := range httpRange.FindAllStringSubmatch(cell, -1) {
			except := map[int]bool{}
			for _, n := range strings.Split(g[2], "/") {
				v, _ := strconv.Atoi(n)
				except[v] = true
			}
			base, _ := strconv.Atoi(g[1])
			for st := base * 100; st < base*100+100; st++ {
				if http.StatusText(st) != "" && !except[st] {
					namedHTTP[st] = true
					check("HTTP "+strconv.Itoa(st), client.ClassifyHTTP(&http.Response{StatusCode: st}, nil))
				}
			}
		}
		for _, n := range httpStatus.FindAllString(httpRange.ReplaceAllString(cell, ""), -1) {
			st, _ := strconv.Atoi(n)
			namedHTTP[st] = true
			check("HTTP "+n, client.ClassifyHTTP(&http.Response{StatusCode: st}, nil))
		}
		for _, w := range upperWord.FindAllString(cell, -1) {
			if c, ok := grpcCodes[w]; ok {
				namedGRPC[c] = true
				check("gRPC "+w, client.ClassifyGRPC(status.Error(c, "x")))
			}
		}
	}
	if rows != 3 {
		t.Fatalf("%s: %d rows with a class (final, retryable, ambiguous), want 3", tb.Where(tb.Rows[0]), rows)
	}
	for st := 400; st < 600; st++ {
		if http.StatusText(st) != "" && !namedHTTP[st] {
			if got := client.ClassOf(client.ClassifyHTTP(&http.Response{StatusCode: st}, nil)); got != client.Ambiguous {
				t.Errorf("docs/client.md: HTTP %d is %s, but no row of the table names it (an unmarked error is ambiguous)", st, got)
			}
		}
	}
	for name, c := range grpcCodes {
		if !namedGRPC[c] {
			if got := client.ClassOf(client.ClassifyGRPC(status.Error(c, "x"))); got != client.Ambiguous {
				t.Errorf("docs/client.md: gRPC %s is %s, but no row of the table names it (an unmarked error is ambiguous)", name, got)
			}
		}
	}
}
