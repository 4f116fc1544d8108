package server_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/codes"

	"github.com/opledger/ledger/internal/mdtable"
)

// sentReasons reads the server package's source and returns every
// ErrorInfo reason it can send, with the gRPC code (by its canonical name,
// e.g. FAILED_PRECONDITION) of each status that carries it. A reason is
// one of the Reason* constants; a status is a withDetails call whose
// details include info(reason, ...). It fails the test on an info call it
// cannot attribute (not in a withDetails call, or with a reason that is
// not a constant).
func sentReasons(t *testing.T) map[string][]string {
	t.Helper()
	// os.ReadDir, not filepath.Glob, which takes an error reading the
	// directory for no files.
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".go") {
			files = append(files, e.Name())
		}
	}
	codeByName := map[string]string{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		codeByName[c.String()] = rpccode.Code_name[int32(c)]
	}
	fset := token.NewFileSet()
	consts := map[string]string{} // Reason* constant -> its value
	var parsed []*ast.File
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, file)
		for _, d := range file.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Reason") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Errorf("%s: %s is not a string constant", fset.Position(n.Pos()), n.Name)
						continue
					}
					consts[n.Name], _ = strconv.Unquote(lit.Value)
				}
			}
		}
	}
	sent := map[string][]string{}
	attributed := map[*ast.CallExpr]bool{}
	isCall := func(e ast.Expr, name string) (*ast.CallExpr, bool) {
		c, ok := e.(*ast.CallExpr)
		if !ok {
			return nil, false
		}
		id, ok := c.Fun.(*ast.Ident)
		return c, ok && id.Name == name
	}
	for _, file := range parsed {
		ast.Inspect(file, func(n ast.Node) bool {
			wd, ok := isCall(asExpr(n), "withDetails")
			if !ok || len(wd.Args) < 3 {
				return true
			}
			sel, ok := wd.Args[0].(*ast.SelectorExpr)
			code := ""
			if ok {
				if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "codes" {
					code = codeByName[sel.Sel.Name]
				}
			}
			for _, a := range wd.Args[2:] {
				in, ok := isCall(a, "info")
				if !ok {
					continue
				}
				attributed[in] = true
				id, ok := in.Args[0].(*ast.Ident)
				reason, known := "", false
				if ok {
					reason, known = consts[id.Name]
				}
				switch {
				case !known:
					t.Errorf("%s: an ErrorInfo whose reason is not a Reason* constant", fset.Position(in.Pos()))
				case code == "":
					t.Errorf("%s: %s is sent with a code that is not a codes.X constant", fset.Position(in.Pos()), reason)
				case !slices.Contains(sent[reason], code):
					sent[reason] = append(sent[reason], code)
				}
			}
			return true
		})
	}
	for _, file := range parsed {
		ast.Inspect(file, func(n ast.Node) bool {
			if in, ok := isCall(asExpr(n), "info"); ok && !attributed[in] {
				t.Errorf("%s: an ErrorInfo outside a withDetails call: the test cannot tell its code", fset.Position(in.Pos()))
			}
			return true
		})
	}
	for name, reason := range consts {
		if _, ok := sent[reason]; !ok {
			t.Errorf("server: %s (%s) is defined but never sent", name, reason)
		}
	}
	if len(sent) == 0 {
		t.Fatal("no ErrorInfo reasons found in the server package")
	}
	return sent
}

func asExpr(n ast.Node) ast.Expr {
	e, _ := n.(ast.Expr)
	return e
}

// TestErrorTablesMatchReasons holds the error tables of README.md,
// docs/contract.md and docs/design.md to the ErrorInfo reasons the service
// sends: every reason in each, with the gRPC code it is sent with, and no
// reason in them that the service does not send.
func TestErrorTablesMatchReasons(t *testing.T) {
	sent := sentReasons(t)
	for _, c := range []struct {
		doc, section, reasonCol, codeCol string
	}{
		{"README.md", "Errors", "reason", "code"},
		{"docs/contract.md", "5. Errors", "reason", "code"},
		{"docs/design.md", "11. Errors on the wire", "ErrorInfo reason", "gRPC code"},
	} {
		d, err := mdtable.Read(c.doc)
		if err != nil {
			t.Fatal(err)
		}
		s, ok := d.Section(c.section)
		if !ok {
			t.Errorf("%s: no section %q (the table of errors)", c.doc, c.section)
			continue
		}
		tb, ok := s.TableWith(c.reasonCol, c.codeCol)
		if !ok {
			t.Errorf("%s, section %q: no table with columns %q and %q", c.doc, c.section, c.reasonCol, c.codeCol)
			continue
		}
		documented := map[string]bool{}
		for _, r := range tb.Rows {
			spans := mdtable.CodeSpans(r.Cell(tb.Column(c.reasonCol)))
			if len(spans) == 0 {
				continue // a status without ErrorInfo, such as grpc-go's own
			}
			docCode := strings.Trim(strings.TrimSpace(r.Cell(tb.Column(c.codeCol))), "`")
			for _, reason := range spans {
				documented[reason] = true
				got, ok := sent[reason]
				switch {
				case !ok:
					t.Errorf("%s: documents the reason %s, which the service never sends", tb.Where(r), reason)
				case len(got) != 1 || got[0] != docCode:
					t.Errorf("%s: documents %s with the code %s; the service sends it with %s", tb.Where(r), reason, docCode, strings.Join(got, ", "))
				}
			}
		}
		for _, reason := range slices.Sorted(maps.Keys(sent)) {
			if !documented[reason] {
				t.Errorf("%s: the table of errors (line %d) does not document %s (%s)", c.doc, tb.Line, reason, strings.Join(sent[reason], ", "))
			}
		}
	}
}
