package mcpgateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"maps"
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

// TestDocsMetrics: docs/mcp.md's metrics table names every ledgermcp_
// metric the gateway exports, with its type and labels, and no other.
func TestDocsMetrics(t *testing.T) {
	doc, err := mdtable.Read("docs/mcp.md")
	if err != nil {
		t.Fatal(err)
	}
	tab, ok := doc.All().TableWith("metric", "type", "labels")
	if !ok {
		t.Fatal("docs/mcp.md has no metrics table")
	}
	documented := map[string]string{}
	for _, r := range tab.Rows {
		labels := strings.Fields(strings.ReplaceAll(r.Cell(tab.Column("labels")), ",", " "))
		slices.Sort(labels)
		documented[strings.Trim(r.Cell(tab.Column("metric")), "`")] = r.Cell(tab.Column("type")) + " " + strings.Join(labels, ",")
	}
	cfg, err := ParseConfig([]byte("upstreams:\n  - {name: t, command: [x]}\n"), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// A vector shows once it has a series.
	g.metrics.calls.WithLabelValues("t_x", outcomeExecuted).Inc()
	g.metrics.duration.WithLabelValues("t_x").Observe(0)
	g.metrics.asText.WithLabelValues("t_x", misfitShape).Inc()
	families, err := g.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]string{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "ledgermcp_") {
			continue
		}
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		slices.Sort(labels)
		exported[f.GetName()] = strings.ToLower(f.GetType().String()) + " " + strings.Join(labels, ",")
	}
	if !maps.Equal(documented, exported) {
		t.Fatalf("docs/mcp.md documents the metrics %q; the gateway exports %q", documented, exported)
	}
}
