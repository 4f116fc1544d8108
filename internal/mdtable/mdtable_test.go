package mdtable

import (
	"reflect"
	"testing"
)

const sample = "# Title\n" +
	"\n" +
	"## Flags\n" +
	"\n" +
	"| flag | environment | default |\n" +
	"| --- | :---: | ---: |\n" +
	"| `--listen` | `LEDGER_LISTEN` | `127.0.0.1:50051` |\n" +
	"|`--a`, `--b`|`X_*`| none|\n" +
	"| `a|b` in code | escaped \\| pipe | |\n" +
	"\n" +
	"```sh\n" +
	"# not a heading\n" +
	"| not | a table |\n" +
	"| --- | --- |\n" +
	"```\n" +
	"\n" +
	"### Sub\n" +
	"text `--inner` and `--x=1` and `plain`\n" +
	"\n" +
	"## Next\n" +
	"| a | b |\n" +
	"|---|---|\n" +
	"| 1 | 2 |\n"

func TestSectionsAndTables(t *testing.T) {
	d := Parse("doc.md", sample)
	s, ok := d.Section("Flags")
	if !ok {
		t.Fatal("no section Flags")
	}
	if got, want := s.Headings(), []string{"Flags", "Sub"}; !reflect.DeepEqual(got, want) {
		t.Errorf("headings of Flags = %q, want %q (a heading in a code block is none)", got, want)
	}
	ts := s.Tables()
	if len(ts) != 1 {
		t.Fatalf("Flags has %d tables, want 1 (a table in a code block is none): %+v", len(ts), ts)
	}
	tb := ts[0]
	if tb.Line != 5 || tb.Where(tb.Rows[0]) != "doc.md:7" {
		t.Errorf("table at line %d, first row at %s; want 5 and doc.md:7", tb.Line, tb.Where(tb.Rows[0]))
	}
	if got, want := tb.Header, []string{"flag", "environment", "default"}; !reflect.DeepEqual(got, want) {
		t.Errorf("header = %q, want %q", got, want)
	}
	want := [][]string{
		{"`--listen`", "`LEDGER_LISTEN`", "`127.0.0.1:50051`"},
		{"`--a`, `--b`", "`X_*`", "none"},
		{"`a|b` in code", "escaped | pipe", ""},
	}
	for i, r := range tb.Rows {
		if !reflect.DeepEqual(r.Cells, want[i]) {
			t.Errorf("row %d = %q, want %q", i, r.Cells, want[i])
		}
	}
	if c := tb.Column("Environment"); c != 1 {
		t.Errorf("Column(Environment) = %d, want 1", c)
	}
	if got := tb.Rows[2].Cell(7); got != "" {
		t.Errorf("missing cell = %q, want empty", got)
	}
	if _, ok := s.TableWith("flag", "meaning"); ok {
		t.Error("TableWith found a table without a meaning column")
	}
	if got, want := Flags(tb.Rows[1].Cells[0]), []string{"a", "b"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Flags = %q, want %q", got, want)
	}
	lines, _ := s.Text()
	var flags []string
	for _, l := range lines {
		flags = append(flags, Flags(l)...)
	}
	if want := []string{"listen", "a", "b", "inner", "x"}; !reflect.DeepEqual(flags, want) {
		t.Errorf("flags of the section's text = %q, want %q", flags, want)
	}
	if got, want := CodeSpans("a `b` c ` d ` `e"), []string{"b", "d"}; !reflect.DeepEqual(got, want) {
		t.Errorf("CodeSpans = %q, want %q", got, want)
	}
	next, ok := d.Section("Next")
	if !ok || len(next.Tables()) != 1 || next.Tables()[0].Rows[0].Cell(1) != "2" {
		t.Errorf("section Next: %v, tables %+v", ok, next.Tables())
	}
	if _, ok := d.Section("not a heading"); ok {
		t.Error("found a section for a comment in a code block")
	}
}

func TestCodeBlocks(t *testing.T) {
	d := Parse("doc.md", sample+"\n~~~ yaml title\nkey: 1\n  nested: \"```\"\n~~~\n\n```\nunclosed\n")
	got := d.All().CodeBlocks()
	want := []CodeBlock{
		{Info: "sh", Line: 11, Text: "# not a heading\n| not | a table |\n| --- | --- |\n"},
		{Info: "yaml", Line: 25, Text: "key: 1\n  nested: \"```\"\n"},
		{Info: "", Line: 30, Text: "unclosed\n\n"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("CodeBlocks = %+v, want %+v", got, want)
	}
	s, _ := d.Section("Sub")
	if got := s.CodeBlocks(); len(got) != 0 {
		t.Errorf("CodeBlocks of Sub = %+v, want none (the block is in Flags, before Sub)", got)
	}
}

func TestCheckDefault(t *testing.T) {
	for _, c := range []struct {
		cell, def string
		agree     bool
	}{
		{"`127.0.0.1:50051`", "127.0.0.1:50051", true},
		{"`1s`", "1s", true},
		{"`1000ms` (a second)", "1s", true},
		{"`100ms`", "1s", false},
		{"`250`", "250", true},
		{"`250`", "25", false},
		{"`0`", "0.0", true},
		{"`true`", "false", false},
		{"empty", "", true},
		{"empty: embedded engine", "", true},
		{"none", "false", true},
		{"off", "x", false},
		{"the system's roots", "", true},
		{"offline", "x", true},
	} {
		msg := CheckDefault(c.cell, c.def)
		if (msg == "") != c.agree {
			t.Errorf("CheckDefault(%q, %q) = %q; want agreement %v", c.cell, c.def, msg, c.agree)
		}
	}
}

func TestAnchors(t *testing.T) {
	d := Parse("doc.md", "# The ledger\n## Runbook: UNKNOWN operations\n```\n# not one\n<a id=\"no\"></a>\n```\n### 3.1 `--flag` & more\n<a id=\"runbook-x\"></a>\n## Runbook: UNKNOWN operations\n")
	got := d.Anchors()
	for _, want := range []string{"the-ledger", "runbook-unknown-operations", "31---flag--more", "runbook-unknown-operations-1", "runbook-x"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if len(got) != 5 {
		t.Errorf("anchors %v, want 5 (nothing in a code block is one)", got)
	}
}
