package ledger

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/mdtable"
)

// stripLuaComments returns src with its comments ("--" to the end of the
// line, outside string literals) blanked, line numbers kept.
func stripLuaComments(src string) string {
	var b strings.Builder
	quote := byte(0)
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case quote != 0:
			if c == '\\' && i+1 < len(src) {
				b.WriteByte(c)
				i++
				c = src[i]
			} else if c == quote || c == '\n' {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '-' && i+1 < len(src) && src[i+1] == '-':
			for i < len(src) && src[i] != '\n' {
				i++
			}
			if i < len(src) {
				b.WriteByte('\n')
			}
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

var (
	// luaReasons is one "NAME=L" of common.lua's REASONS.
	luaReasons = regexp.MustCompile(`\b([A-Z_]+)=([A-Z])\b`)
	// luaWrite is a call of transition(to, reason, ...) or
	// finish(to, reason, ...), the two writers of a history entry.
	luaWrite = regexp.MustCompile(`\b(transition|finish)\(\s*[^,()]+,\s*([^,()]+)`)
	// luaFunc is the header of a local function.
	luaFunc = regexp.MustCompile(`local function (\w+)\(([^)]*)\)`)
	// luaString is a string literal with no escapes.
	luaString = regexp.MustCompile(`^'([^'\\]*)'$|^"([^"\\]*)"$`)
)

// writtenReasons reads the scripts and returns, by script file name, the
// history reasons each one can write: the reason given to transition or
// finish as a string literal, or as a parameter of the local function the
// call is in, given as a literal by each call of that function. It fails
// the test on a reason it cannot tell.
func writtenReasons(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob("scripts/*.lua")
	if err != nil {
		t.Fatal(err)
	}
	written := map[string][]string{}
	add := func(file, reason string) {
		if !slices.Contains(written[file], reason) {
			written[file] = append(written[file], reason)
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src := stripLuaComments(string(b))
		name := filepath.Base(f)
		line := func(off int) string {
			return "ledger/" + filepath.ToSlash(f) + ":" + strconv.Itoa(1+strings.Count(src[:off], "\n"))
		}
		for _, m := range luaWrite.FindAllStringSubmatchIndex(src, -1) {
			arg := strings.TrimSpace(src[m[4]:m[5]])
			if lit := luaString.FindStringSubmatch(arg); lit != nil {
				add(name, lit[1]+lit[2])
				continue
			}
			// A parameter of the enclosing local function: the reasons are
			// the literals its callers pass in that place.
			var fn []int
			for _, h := range luaFunc.FindAllStringSubmatchIndex(src[:m[0]], -1) {
				fn = h
			}
			param := -1
			if fn != nil {
				for i, p := range strings.Split(src[fn[4]:fn[5]], ",") {
					if strings.TrimSpace(p) == arg {
						param = i
					}
				}
			}
			if param < 0 {
				t.Errorf("%s: %s writes the reason %s, neither a string literal nor a parameter of a local function", line(m[0]), src[m[2]:m[3]], arg)
				continue
			}
			fname := src[fn[2]:fn[3]]
			calls := regexp.MustCompile(`\b`+regexp.QuoteMeta(fname)+`\(([^()]*)\)`).FindAllStringSubmatchIndex(src, -1)
			for _, c := range calls {
				if c[0] == fn[0]+len("local function ") {
					continue // the function's own header
				}
				args := strings.Split(src[c[2]:c[3]], ",")
				var lit []string
				if param < len(args) {
					lit = luaString.FindStringSubmatch(strings.TrimSpace(args[param]))
				}
				if lit == nil {
					t.Errorf("%s: %s passes a reason that is not a string literal", line(c[0]), fname)
					continue
				}
				add(name, lit[1]+lit[2])
			}
		}
	}
	if len(written) == 0 {
		t.Fatal("ledger: the scripts write no history reason")
	}
	return written
}

// protoReasons returns the reasons the comment of HistoryEntry.reason in
// ledger.proto lists ("Why: RESERVED, CLAIMED, ... or ESCALATED."), and
// where the comment is.
func protoReasons(t *testing.T) ([]string, string) {
	t.Helper()
	const name = "proto/ledger/v1/ledger.proto"
	b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	inEntry := false
	for i, l := range lines {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "message HistoryEntry "):
			inEntry = true
		case inEntry && l == "}":
			inEntry = false
		case inEntry && regexp.MustCompile(`^string\s+reason\s*=`).MatchString(l):
			var comment []string
			j := i - 1
			for ; j >= 0 && strings.HasPrefix(strings.TrimSpace(lines[j]), "//"); j-- {
				comment = append([]string{strings.TrimPrefix(strings.TrimSpace(lines[j]), "//")}, comment...)
			}
			text := strings.Join(comment, " ")
			_, list, ok := strings.Cut(text, "Why:")
			if !ok {
				t.Fatalf("%s:%d: the comment of HistoryEntry.reason lists no reasons (\"Why: ...\")", name, j+2)
			}
			return regexp.MustCompile(`\b[A-Z][A-Z_]+\b`).FindAllString(list, -1), name + ":" + strconv.Itoa(j+2)
		}
	}
	t.Fatalf("%s: no field reason in message HistoryEntry", name)
	return nil, ""
}

// TestHistoryReasonsMatchScripts holds the history reasons together: the
// letters common.lua's REASONS stores them as and record.go's reasonNames
// reads them by, the reasons the scripts write, the table "History reasons"
// of docs/design.md, the history columns of its transition tables (each
// table the reasons its script writes) and the comment of
// HistoryEntry.reason in ledger.proto.
func TestHistoryReasonsMatchScripts(t *testing.T) {
	written := writtenReasons(t)
	all := map[string]bool{}
	for _, rs := range written {
		for _, r := range rs {
			all[r] = true
		}
	}

	// The letters.
	common, err := os.ReadFile("scripts/common.lua")
	if err != nil {
		t.Fatal(err)
	}
	def := regexp.MustCompile(`(?s)local REASONS = (.*?)\n\n`).FindSubmatch(common)
	if def == nil {
		t.Fatal("ledger/scripts/common.lua: no REASONS")
	}
	letters := map[string]string{}
	for _, m := range luaReasons.FindAllStringSubmatch(string(def[1]), -1) {
		letters[m[1]] = m[2]
	}
	for name, l := range letters {
		i := int(l[0] - 'A')
		switch {
		case i >= len(reasonNames) || reasonNames[i] != name:
			t.Errorf("ledger/scripts/common.lua stores %s as %s; record.go's reasonNames reads %s as %q", name, l, l, reasonName(l))
		case !all[name]:
			t.Errorf("ledger/scripts/common.lua defines the reason %s, which no script writes", name)
		}
	}
	for i, name := range reasonNames {
		if letters[name] != string(rune('A'+i)) {
			t.Errorf("ledger/record.go reads %c as %s; common.lua's REASONS stores %s as %q", 'A'+i, name, name, letters[name])
		}
	}
	for _, r := range slices.Sorted(maps.Keys(all)) {
		if _, ok := letters[r]; !ok {
			t.Errorf("ledger/scripts: a script writes the reason %s, which common.lua's REASONS does not define", r)
		}
	}

	// The table of reasons.
	const docName = "docs/design.md"
	d, err := mdtable.Read(docName)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := d.Section("History reasons")
	if !ok {
		t.Fatalf("%s: no section \"History reasons\"", docName)
	}
	tb, ok := s.TableWith("reason")
	if !ok {
		t.Fatalf("%s, section \"History reasons\": no table with a column reason", docName)
	}
	documented := map[string]bool{}
	for _, r := range tb.Rows {
		reason := strings.Trim(r.Cell(tb.Column("reason")), "` ")
		documented[reason] = true
		if !all[reason] {
			t.Errorf("%s: documents the history reason %s, which no script writes", tb.Where(r), reason)
		}
	}
	for _, r := range slices.Sorted(maps.Keys(all)) {
		if !documented[r] {
			t.Errorf("%s: the table of history reasons (line %d) does not list %s (written by %s)", docName, tb.Line, r, strings.Join(scriptsWriting(written, r), ", "))
		}
	}

	// The transition tables: under each heading that names a script, the
	// history column names the reasons that script writes.
	tt, ok := d.Section("3.3 Transition tables")
	if !ok {
		t.Fatalf("%s: no section \"3.3 Transition tables\"", docName)
	}
	for _, h := range tt.Headings()[1:] {
		var script string
		for _, c := range mdtable.CodeSpans(h) {
			if strings.HasSuffix(c, ".lua") {
				script = c
			}
		}
		if script == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join("scripts", script)); err != nil {
			t.Errorf("%s: the heading %q names %s, which is not a script", docName, h, script)
			continue
		}
		sub, _ := d.Section(h)
		named := map[string]bool{}
		for _, ttb := range sub.Tables() {
			col := -1
			for i, c := range ttb.Header {
				if strings.HasPrefix(strings.ToLower(c), "history reason") {
					col = i
				}
			}
			if col < 0 {
				continue
			}
			for _, r := range ttb.Rows {
				cell := strings.TrimSpace(r.Cell(col))
				if cell == "—" || cell == "-" {
					continue
				}
				reason := strings.Trim(strings.FieldsFunc(cell, func(c rune) bool { return c == ' ' || c == ',' || c == '(' })[0], "`")
				named[reason] = true
				if !slices.Contains(written[script], reason) {
					t.Errorf("%s: the table of %s has the history reason %q, which %s does not write", ttb.Where(r), script, reason, script)
				}
			}
		}
		for _, r := range written[script] {
			if !named[r] {
				t.Errorf("%s: the tables under %q do not show the history reason %s, which %s writes", docName, h, r, script)
			}
		}
	}

	// The proto's comment.
	listed, where := protoReasons(t)
	for _, r := range listed {
		if !all[r] {
			t.Errorf("%s: the comment of HistoryEntry.reason lists %s, which no script writes", where, r)
		}
	}
	for _, r := range slices.Sorted(maps.Keys(all)) {
		if !slices.Contains(listed, r) {
			t.Errorf("%s: the comment of HistoryEntry.reason does not list %s", where, r)
		}
	}
}

// scriptsWriting returns the scripts that write reason, sorted.
func scriptsWriting(written map[string][]string, reason string) []string {
	var files []string
	for f, rs := range written {
		if slices.Contains(rs, reason) {
			files = append(files, f)
		}
	}
	slices.Sort(files)
	return files
}
