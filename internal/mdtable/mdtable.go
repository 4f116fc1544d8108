// Package mdtable reads what the tests that hold the documentation to the
// code need from a Markdown document: its sections, its pipe tables (cells
// split and trimmed), its fenced code blocks and the code spans of a piece
// of text. Outside CodeBlocks, fenced code blocks are skipped: a "# comment"
// in a shell example is not a heading, and a table in an example is not the
// document's.
package mdtable

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Doc is a Markdown document split into lines.
type Doc struct {
	// Name is the document's path, as error messages show it.
	Name string
	// Lines are the document's lines, without their line ends.
	Lines []string
	// fenced[i] is true when line i is inside a fenced code block (or is
	// one of its fences).
	fenced []bool
	// blocks are the fenced code blocks, in order.
	blocks []block
}

// block is a fenced code block: the line indexes of its opening fence and
// of its closing one (len(Lines) when it runs to the end), and its info
// word.
type block struct {
	open, close int
	info        string
}

// Parse splits text into a Doc named name.
func Parse(name, text string) *Doc {
	d := &Doc{Name: name, Lines: strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")}
	d.fenced = make([]bool, len(d.Lines))
	fence := ""
	for i, l := range d.Lines {
		t := strings.TrimSpace(l)
		switch {
		case fence == "" && (strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")):
			fence = t[:3]
			d.fenced[i] = true
			info, _, _ := strings.Cut(strings.TrimSpace(strings.TrimLeft(t, fence[:1])), " ")
			d.blocks = append(d.blocks, block{open: i, close: len(d.Lines), info: info})
		case fence != "":
			d.fenced[i] = true
			if strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]) == "" {
				fence = ""
				d.blocks[len(d.blocks)-1].close = i
			}
		}
	}
	return d
}

// Read reads the file at path, relative to the repository's root, into a
// Doc named path.
func Read(path string) (*Doc, error) {
	root, err := Root()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
	if err != nil {
		return nil, err
	}
	return Parse(path, string(b)), nil
}

// Root returns the repository's root: the nearest directory above the
// working directory (a test's package directory) that holds go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = up
	}
}

// Section is a part of a document: a heading and the lines under it, up to
// the next heading of the same or a higher level.
type Section struct {
	doc        *Doc
	start, end int // line indexes: [start, end)
}

// Heading returns the heading level of line i (1 for "#"), or 0 when it is
// not a heading.
func (d *Doc) heading(i int) int {
	if d.fenced[i] {
		return 0
	}
	l := d.Lines[i]
	n := len(l) - len(strings.TrimLeft(l, "#"))
	if n == 0 || n > 6 || (len(l) > n && l[n] != ' ') {
		return 0
	}
	return n
}

// Section returns the section whose heading's text is title ("## lookup"
// is found by "lookup"), and whether there is one.
func (d *Doc) Section(title string) (Section, bool) {
	for i := range d.Lines {
		lvl := d.heading(i)
		if lvl == 0 || strings.TrimSpace(d.Lines[i][lvl:]) != title {
			continue
		}
		end := len(d.Lines)
		for j := i + 1; j < len(d.Lines); j++ {
			if l := d.heading(j); l > 0 && l <= lvl {
				end = j
				break
			}
		}
		return Section{doc: d, start: i, end: end}, true
	}
	return Section{}, false
}

// All is the whole document as a section.
func (d *Doc) All() Section { return Section{doc: d, start: 0, end: len(d.Lines)} }

// Headings returns the text of every heading of the section, its own first.
func (s Section) Headings() []string {
	var hs []string
	for i := s.start; i < s.end; i++ {
		if lvl := s.doc.heading(i); lvl > 0 {
			hs = append(hs, strings.TrimSpace(s.doc.Lines[i][lvl:]))
		}
	}
	return hs
}

// Text returns the section's text outside fenced code blocks, and the
// 1-based line number of each of its lines.
func (s Section) Text() (lines []string, numbers []int) {
	for i := s.start; i < s.end; i++ {
		if !s.doc.fenced[i] {
			lines = append(lines, s.doc.Lines[i])
			numbers = append(numbers, i+1)
		}
	}
	return lines, numbers
}

// Span is a code span of a document's text, and where it is.
type Span struct {
	// Text is the span's content, without its backticks.
	Text string
	// Where names its line, as Where does.
	Where string
}

// Spans returns the code spans of the section's text outside fenced code
// blocks, in order.
func (s Section) Spans() []Span {
	var spans []Span
	lines, numbers := s.Text()
	for i, l := range lines {
		for _, c := range CodeSpans(l) {
			spans = append(spans, Span{Text: c, Where: s.Where(numbers[i])})
		}
	}
	return spans
}

// CodeBlock is a fenced code block.
type CodeBlock struct {
	// Info is the first word after the opening fence ("yaml" for ```yaml).
	Info string
	// Line is the 1-based line of the opening fence.
	Line int
	// Text is the block's content, without the fences, each line ending in
	// a newline.
	Text string
}

// CodeBlocks returns the fenced code blocks that open in the section, in
// order.
func (s Section) CodeBlocks() []CodeBlock {
	var bs []CodeBlock
	for _, b := range s.doc.blocks {
		if b.open < s.start || b.open >= s.end {
			continue
		}
		var text strings.Builder
		for _, l := range s.doc.Lines[b.open+1 : b.close] {
			text.WriteString(l + "\n")
		}
		bs = append(bs, CodeBlock{Info: b.info, Line: b.open + 1, Text: text.String()})
	}
	return bs
}

// Where names line n (1-based) of the document, for error messages.
func (s Section) Where(n int) string { return s.doc.Name + ":" + strconv.Itoa(n) }

// Table is a pipe table: a header row, a delimiter row, then rows.
type Table struct {
	// Doc is the document's name, Line the 1-based line of the header.
	Doc    string
	Line   int
	Header []string
	Rows   []Row
}

// Row is one row of a table.
type Row struct {
	// Line is the row's 1-based line in the document.
	Line  int
	Cells []string
}

// Where names the row's line, for error messages.
func (t Table) Where(r Row) string { return t.Doc + ":" + strconv.Itoa(r.Line) }

// Column returns the index of the header cell named name (in any letter
// case), or -1.
func (t Table) Column(name string) int {
	for i, h := range t.Header {
		if strings.EqualFold(h, name) {
			return i
		}
	}
	return -1
}

// Cell returns the row's cell in column i, or "" when the row is shorter.
func (r Row) Cell(i int) string {
	if i < 0 || i >= len(r.Cells) {
		return ""
	}
	return r.Cells[i]
}

// Tables returns the section's pipe tables, in order.
func (s Section) Tables() []Table {
	var ts []Table
	d := s.doc
	for i := s.start; i+1 < s.end; i++ {
		if d.fenced[i] || !isRow(d.Lines[i]) || d.fenced[i+1] || !isDelimiter(d.Lines[i+1]) {
			continue
		}
		t := Table{Doc: d.Name, Line: i + 1, Header: splitRow(d.Lines[i])}
		j := i + 2
		for ; j < s.end && !d.fenced[j] && isRow(d.Lines[j]); j++ {
			t.Rows = append(t.Rows, Row{Line: j + 1, Cells: splitRow(d.Lines[j])})
		}
		ts = append(ts, t)
		i = j - 1
	}
	return ts
}

// TableWith returns the section's first table whose header has every one
// of the columns named, and whether there is one.
func (s Section) TableWith(columns ...string) (Table, bool) {
	for _, t := range s.Tables() {
		ok := true
		for _, c := range columns {
			ok = ok && t.Column(c) >= 0
		}
		if ok {
			return t, true
		}
	}
	return Table{}, false
}

func isRow(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), "|") }

func isDelimiter(l string) bool {
	cells := splitRow(l)
	if len(cells) == 0 {
		return false
	}
	for _, c := range cells {
		c = strings.Trim(c, ":")
		if c == "" || strings.Trim(c, "-") != "" {
			return false
		}
	}
	return true
}

// splitRow splits a table row into its trimmed cells, at the pipes that are
// neither escaped (\|) nor inside a code span.
func splitRow(l string) []string {
	l = strings.TrimSpace(l)
	l = strings.TrimPrefix(l, "|")
	var cells []string
	var cur strings.Builder
	inCode := false
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case c == '\\' && i+1 < len(l) && l[i+1] == '|':
			cur.WriteByte('|')
			i++
			continue
		case c == '`':
			inCode = !inCode
		case c == '|' && !inCode:
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
			continue
		}
		cur.WriteByte(c)
	}
	if rest := strings.TrimSpace(cur.String()); rest != "" {
		cells = append(cells, rest)
	}
	return cells
}

// CodeSpans returns the contents of the code spans (`...`) of s, trimmed.
func CodeSpans(s string) []string {
	var spans []string
	for {
		i := strings.IndexByte(s, '`')
		if i < 0 {
			return spans
		}
		j := strings.IndexByte(s[i+1:], '`')
		if j < 0 {
			return spans
		}
		spans = append(spans, strings.TrimSpace(s[i+1:i+1+j]))
		s = s[i+1+j+1:]
	}
}

// Flags returns the flag names (without dashes) that s shows as code spans
// starting with "--" ("`--addr HOST:PORT`" is "addr"), in order.
func Flags(s string) []string {
	var names []string
	for _, c := range CodeSpans(s) {
		if !strings.HasPrefix(c, "--") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(c, "--"), " ")
		name, _, _ = strings.Cut(name, "=")
		if name != "" {
			names = append(names, name)
		}
	}
	return names
}

// CheckDefault compares a flag's default as a table cell shows it with its
// default value def (flag.Flag's DefValue), and returns what differs (""
// when they agree). The cell's first code span is the default, compared as
// a duration or a number when both read as one (`1s` is `1000ms`); a cell
// that starts with "empty", "none" or "off" is an empty string (or false);
// other words ("the system's roots") are not checked.
func CheckDefault(cell, def string) string {
	spans := CodeSpans(cell)
	if len(spans) == 0 {
		word := strings.ToLower(strings.TrimSpace(cell))
		for _, zero := range []string{"empty", "none", "off"} {
			if word == zero || strings.HasPrefix(word, zero+":") || strings.HasPrefix(word, zero+" ") {
				if def != "" && def != "false" {
					return "documented as " + zero + ", but it is " + strconv.Quote(def)
				}
			}
		}
		return ""
	}
	doc := spans[0]
	if doc == def {
		return ""
	}
	if a, err := time.ParseDuration(doc); err == nil {
		if b, err := time.ParseDuration(def); err == nil && a == b {
			return ""
		}
	}
	if a, err := strconv.ParseFloat(doc, 64); err == nil {
		if b, err := strconv.ParseFloat(def, 64); err == nil && a == b {
			return ""
		}
	}
	return "documented as " + strconv.Quote(doc) + ", but it is " + strconv.Quote(def)
}

// htmlAnchor is an explicit anchor: <a id="name"></a> (or name="name").
var htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)

// Anchors returns the document's anchors: those of its headings, as GitHub
// makes them ("### Runbook: UNKNOWN operations" is
// "runbook-unknown-operations"; a repeated one gets "-1", "-2", ...), and
// its explicit ones (<a id="name"></a>).
func (d *Doc) Anchors() map[string]bool {
	anchors := map[string]bool{}
	for _, h := range d.All().Headings() {
		a := Anchor(h)
		for n := 1; anchors[a]; n++ {
			a = Anchor(h) + "-" + strconv.Itoa(n)
		}
		anchors[a] = true
	}
	lines, _ := d.All().Text()
	for _, l := range lines {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			anchors[m[1]] = true
		}
	}
	return anchors
}

// Anchor returns the anchor GitHub gives a heading with the text h: in
// lower case, spaces as hyphens, without punctuation but '-' and '_'.
func Anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
