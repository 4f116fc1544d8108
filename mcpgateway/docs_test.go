package mcpgateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/mdtable"
)

// TestDocsConfigParses: the configuration docs/mcp.md shows is one the
// gateway takes.
func TestDocsConfigParses(t *testing.T) {
	doc, err := mdtable.Read("docs/mcp.md")
	if err != nil {
		t.Fatal(err)
	}
	sec, ok := doc.Section("Configuration")
	if !ok {
		t.Fatal("docs/mcp.md has no Configuration section")
	}
	env := func(string) (string, bool) { return "x.y", true }
	n := 0
	for _, b := range sec.CodeBlocks() {
		if b.Info != "yaml" {
			continue
		}
		n++
		if _, err := ParseConfig([]byte(b.Text), env); err != nil {
			t.Errorf("%s: %v", sec.Where(b.Line), err)
		}
	}
	if n == 0 {
		t.Fatal("no yaml block in docs/mcp.md's Configuration section")
	}
}

// TestDocsOutcomes: docs/mcp.md's outcome table lists every outcome an
// answer may carry, and only those.
func TestDocsOutcomes(t *testing.T) {
	doc, err := mdtable.Read("docs/mcp.md")
	if err != nil {
		t.Fatal(err)
	}
	tab, ok := doc.All().TableWith("outcome", "meaning")
	if !ok {
		t.Fatal("docs/mcp.md has no outcome table")
	}
	var documented []string
	for _, r := range tab.Rows {
		documented = append(documented, strings.Trim(r.Cell(tab.Column("outcome")), "`"))
	}
	var code []string
	f, err := parser.ParseFile(token.NewFileSet(), "call.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok && strings.HasPrefix(vs.Names[0].Name, "outcome") {
			if lit, ok := vs.Values[0].(*ast.BasicLit); ok {
				s, _ := strconv.Unquote(lit.Value)
				code = append(code, s)
			}
		}
		return true
	})
	slices.Sort(documented)
	slices.Sort(code)
	if !slices.Equal(documented, code) {
		t.Fatalf("docs/mcp.md lists outcomes %q; call.go has %q", documented, code)
	}
}

// TestContractNamesTheMetaKeys: docs/contract.md's wire names of the
// gateway are its _meta keys and the fields of its answers' object.
func TestContractNamesTheMetaKeys(t *testing.T) {
	doc, err := mdtable.Read("docs/contract.md")
	if err != nil {
		t.Fatal(err)
	}
	sec, ok := doc.Section("10. Other surfaces")
	if !ok {
		t.Fatal("docs/contract.md has no section 10")
	}
	lines, _ := sec.Text()
	var spans []string
	for _, l := range lines {
		spans = append(spans, mdtable.CodeSpans(l)...)
	}
	for _, want := range []string{MetaIdempotencyKey, MetaOperationID, MetaRunID, MetaPermitID, MetaFencingToken, MetaLedger,
		"operationId", "outcome", "replayed", "attempt"} {
		if !slices.Contains(spans, want) {
			t.Errorf("docs/contract.md §10 does not name %s", want)
		}
	}
}
