package polyglot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/mdtable"
	"github.com/opledger/ledger/internal/redistest"
)

// readmeAddr and readmeHTTPAddr are the addresses the README's commands
// use (gRPC, and the HTTP/JSON API of --http-listen); the test rewrites them
// to its own ledgerd's.
const (
	readmeAddr     = "127.0.0.1:50051"
	readmeHTTPAddr = "127.0.0.1:8080"
)

// walkthroughSection is the README section whose commands the test runs.
const walkthroughSection = "## Quick start with grpcurl"

// volatileTimes are the JSON fields whose values differ on every run: they
// must be timestamps, and are compared as such.
var volatileTimes = map[string]bool{
	"createdAt": true, "updatedAt": true, "leaseExpiresAt": true, "expiresAt": true, "time": true,
	"unknownSince": true, "recoveryDeadline": true, "retainUntil": true,
	"startedAt": true, "deadlineAt": true, "endedAt": true,
}

// boundValues are the JSON fields whose values differ on every run (a
// history head hashes the entries' times) but must be consistent: the first value the README shows is bound to the first the
// service returned, and every later occurrence in an output must agree with
// that binding. A command must not carry one: a reader's run has another,
// so the command must take it from the earlier answer, as a reader's would.
var boundValues = map[string]bool{"fencingToken": true, "historyHead": true}

// step is one command of the walkthrough and the output the README shows.
type step struct {
	doc      string // the file it is in
	line     int    // in doc
	command  string // after "$ ", with its continuation lines
	expected string // "" when the README shows none
	hasOut   bool
}

// TestREADMEWalkthrough runs every grpcurl command of the README's quick
// start as written (only the address is this test's ledgerd's), one after
// the other in one directory, against a live ledgerd, and compares each
// output with the one the README shows (timestamps normalized, fencing
// tokens bound), so the README never lies and a reader can run it. It runs
// twice, as the README offers: on the embedded engine (make run) and on a
// redis-server (LEDGER_REDIS_URL), whose Lua and encodings are not the
// embedded engine's.
func TestREADMEWalkthrough(t *testing.T) {
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		walkREADME(t)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		walkREADME(t, "--redis-url", "redis://"+redistest.Start(t).Addr+"/0")
	})
}

// walkREADME runs the README's walkthrough against a fresh ledgerd started
// with flags.
func walkREADME(t *testing.T, flags ...string) {
	walkDoc(t, "README.md", walkthroughSection, flags...)
}

// TestREADMECurlWalkthrough runs the README's curl quick start against the
// HTTP/JSON API as TestREADMEWalkthrough runs the grpcurl one.
func TestREADMECurlWalkthrough(t *testing.T) {
	t.Parallel()
	_, err := exec.LookPath("curl")
	need(t, err == nil, "curl is not installed")
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		walkDoc(t, "README.md", "## Quick start with curl")
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		walkDoc(t, "README.md", "## Quick start with curl", "--redis-url", "redis://"+redistest.Start(t).Addr+"/0")
	})
}

// TestRunsWalkthrough runs docs/runs.md's grpcurl walkthrough as
// TestREADMEWalkthrough runs the README's, on both engines.
func TestRunsWalkthrough(t *testing.T) {
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		walkDoc(t, "docs/runs.md", "## A run in grpcurl")
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		walkDoc(t, "docs/runs.md", "## A run in grpcurl", "--redis-url", "redis://"+redistest.Start(t).Addr+"/0")
	})
}

// walkDoc runs the grpcurl commands of section of doc against a fresh
// ledgerd started with flags.
func walkDoc(t *testing.T, doc, section string, flags ...string) {
	root := repoRoot(t)
	grpcurl := findGrpcurl(t, root)
	_, err := exec.LookPath("jq")
	need(t, err == nil, "jq is not installed")
	text, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(doc)))
	if err != nil {
		t.Fatal(err)
	}
	steps, err := parseWalkthrough(doc, string(text), section)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) < 5 {
		t.Fatalf("found only %d grpcurl commands in %s %q: the parser or the doc changed", len(steps), doc, section)
	}

	w := &walk{t: t, grpcurl: grpcurl, dir: t.TempDir(), bound: map[string]string{}}
	w.addr, w.httpAddr = startLedgerdHTTP(t, flags...)
	answers := make([]answer, len(steps))
	for i, s := range steps {
		answers[i] = w.run(s)
	}
	for _, p := range w.problems {
		t.Error(p)
	}
}

// TestREADMEPinnedVersions checks that the tool versions the README names are
// the ones the Makefile pins.
func TestREADMEPinnedVersions(t *testing.T) {
	root := repoRoot(t)
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	pins := map[string]string{
		"GRPCURL_VERSION":            "grpcurl@%s",
		"BUF_VERSION":                "buf %s",
		"PROTOC_GEN_GO_VERSION":      "protoc-gen-go %s",
		"PROTOC_GEN_GO_GRPC_VERSION": "protoc-gen-go-grpc %s",
	}
	for name, format := range pins {
		m := regexp.MustCompile(`(?m)^` + name + `\s*:=\s*(\S+)`).FindSubmatch(makefile)
		if m == nil {
			t.Errorf("Makefile: no %s", name)
			continue
		}
		if want := fmt.Sprintf(format, m[1]); !bytes.Contains(readme, []byte(want)) {
			t.Errorf("README.md does not say %q (Makefile: %s := %s)", want, name, m[1])
		}
	}
}

// TestREADMELayout holds the README's Layout table to the repository: every
// path it names exists, and every directory of Go code is under one of them,
// so a package added or moved is not left out of the map.
func TestREADMELayout(t *testing.T) {
	root := repoRoot(t)
	d, err := mdtable.Read("README.md")
	if err != nil {
		t.Fatal(err)
	}
	s, ok := d.Section("Layout")
	if !ok {
		t.Fatal(`README.md: no section "Layout"`)
	}
	tb, ok := s.TableWith("path")
	if !ok {
		t.Fatal(`README.md, section "Layout": no table with a column "path"`)
	}
	var listed []string
	for _, r := range tb.Rows {
		paths := mdtable.CodeSpans(r.Cell(tb.Column("path")))
		if len(paths) == 0 {
			t.Errorf("%s: a row names no path", tb.Where(r))
		}
		for _, p := range paths {
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(p))); err != nil {
				t.Errorf("%s: %s does not exist", tb.Where(r), p)
			}
			listed = append(listed, strings.TrimSuffix(p, "/"))
		}
	}
	under := func(dir string) bool {
		for _, p := range listed {
			if dir == p || strings.HasPrefix(dir, p+"/") {
				return true
			}
		}
		return false
	}
	err = filepath.WalkDir(root, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := e.Name()
		if e.IsDir() && path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata" || name == "bin") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		if rel = filepath.ToSlash(rel); rel != "." && !under(rel) {
			t.Errorf("%s: the Layout table does not cover %s/, which holds Go code", s.Where(tb.Line), rel)
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// findGrpcurl is $LEDGER_TEST_GRPCURL (set by make test), else ./bin/grpcurl
// (make grpcurl), else grpcurl on PATH.
func findGrpcurl(t *testing.T, root string) string {
	t.Helper()
	if p := os.Getenv("LEDGER_TEST_GRPCURL"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("LEDGER_TEST_GRPCURL: %v", err)
		}
		return p
	}
	if p := filepath.Join(root, "bin", "grpcurl"); fileExists(p) {
		return p
	}
	p, err := exec.LookPath("grpcurl")
	need(t, err == nil, "grpcurl is not installed (make grpcurl)")
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// parseWalkthrough returns the commands of the walkthrough section: every
// "$ grpcurl ..." in a console block, with the output lines that follow it,
// and every inline `grpcurl ...` span of the prose, with the output that a
// following "answers `...`" gives.
func parseWalkthrough(doc, text, section string) ([]step, error) {
	lines := strings.Split(text, "\n")
	start, end := -1, len(lines)
	for i, l := range lines {
		if start < 0 && strings.TrimSpace(l) == section {
			start = i + 1
		} else if start >= 0 && strings.HasPrefix(l, "## ") {
			end = i
			break
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("%s has no %q section", doc, section)
	}

	// Inline commands are taken from whole paragraphs (a code span may wrap),
	// in document order with the console blocks.
	inline := regexp.MustCompile("`(grpcurl [^`]+)`(?:\\s+answers\\s+`([^`]+)`)?")
	var steps []step
	var para []string
	var paraLine int
	flush := func() {
		for _, m := range inline.FindAllStringSubmatch(strings.Join(para, " "), -1) {
			steps = append(steps, step{doc: doc, line: paraLine, command: m[1], expected: m[2], hasOut: m[2] != ""})
		}
		para = nil
	}
	for i := start; i < end; i++ {
		l := lines[i]
		if strings.HasPrefix(l, "```") {
			flush()
			j := i + 1
			for j < end && !strings.HasPrefix(lines[j], "```") {
				j++
			}
			if j == end {
				return nil, fmt.Errorf("%s:%d: code block never closed", doc, i+1)
			}
			if strings.TrimSpace(strings.TrimPrefix(l, "```")) == "console" {
				s, err := parseConsole(doc, lines[i+1:j], i+2)
				if err != nil {
					return nil, err
				}
				steps = append(steps, s...)
			}
			i = j
			continue
		}
		if strings.TrimSpace(l) == "" {
			flush()
			continue
		}
		if len(para) == 0 {
			paraLine = i + 1
		}
		para = append(para, strings.TrimSpace(l))
	}
	flush()
	return steps, nil
}

// parseConsole splits a console block into commands ("$ " lines, continued
// while a quote is open or a line ends in a backslash) and their outputs.
func parseConsole(doc string, block []string, firstLine int) ([]step, error) {
	var steps []step
	for i := 0; i < len(block); {
		l := block[i]
		if !strings.HasPrefix(l, "$ ") {
			return nil, fmt.Errorf("%s:%d: console block line is neither a command nor output of one: %q", doc, firstLine+i, l)
		}
		s := step{doc: doc, line: firstLine + i}
		cmd := strings.TrimPrefix(l, "$ ")
		i++
		for (strings.Count(cmd, "'")%2 == 1 || strings.HasSuffix(cmd, "\\")) && i < len(block) {
			cmd += "\n" + block[i]
			i++
		}
		s.command = cmd
		var out []string
		for i < len(block) && !strings.HasPrefix(block[i], "$ ") {
			out = append(out, block[i])
			i++
		}
		s.expected = strings.Join(out, "\n")
		s.hasOut = strings.TrimSpace(s.expected) != ""
		steps = append(steps, s)
	}
	return steps, nil
}

// walk runs the steps in order against one ledgerd.
type walk struct {
	t        *testing.T
	addr     string
	httpAddr string
	grpcurl  string
	dir      string            // where the commands run (the files they write)
	bound    map[string]string // README value -> this run's value (fencing tokens)
	problems []string
}

func (w *walk) errorf(format string, args ...any) {
	w.problems = append(w.problems, fmt.Sprintf(format, args...))
}

// answer is what grpcurl printed for one step.
type answer struct {
	stdout, stderr string
	err            error // the exit status, when not 0
}

// run runs one step and checks its answer.
func (w *walk) run(s step) answer {
	t := w.t
	if !strings.HasPrefix(s.command, "grpcurl ") && !strings.HasPrefix(s.command, "curl ") {
		w.errorf("%s:%d: not a grpcurl or curl command: %q", s.doc, s.line, s.command)
		return answer{}
	}
	cmd := w.command(s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", "-c", cmd)
	c.Dir = w.dir
	c.Env = cleanEnv("PATH=" + filepath.Dir(w.grpcurl) + string(os.PathListSeparator) + os.Getenv("PATH"))
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	c.WaitDelay = 10 * time.Second // bash's grpcurl, killed with it or not, cannot hold Wait
	err := c.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("%s:%d: %v", s.doc, s.line, err)
	}
	t.Logf("%s:%d: $ %s\n%s%s", s.doc, s.line, cmd, stdout.String(), stderr.String())
	a := answer{stdout: stdout.String(), stderr: stderr.String(), err: err}
	w.check(s, a)
	return a
}

// command is the step's command for this run: the README's, with the test's
// ledgerd address instead of the README's. A value the README showed in an
// earlier answer and a reader's run answers otherwise (a fencing token) is
// a problem: the command, as written, fails for every reader.
func (w *walk) command(s step) string {
	for readme := range w.bound {
		if strings.Contains(s.command, `"`+readme+`"`) {
			w.errorf("%s:%d: the command carries %s, a value of the README's run: a reader's differs, so take it from the earlier answer", s.doc, s.line, readme)
		}
	}
	return strings.NewReplacer(readmeAddr, w.addr, readmeHTTPAddr, w.httpAddr).Replace(s.command)
}

// check compares the output the README shows for s with the service's answer.
func (w *walk) check(s step, a answer) {
	expected := strings.TrimSpace(s.expected)
	wantError := strings.HasPrefix(expected, "ERROR:")
	switch {
	case wantError && a.err == nil:
		w.errorf("%s:%d: the README shows an error, grpcurl succeeded:\n%s", s.doc, s.line, a.stdout)
		return
	case !wantError && a.err != nil:
		w.errorf("%s:%d: grpcurl failed (%v):\n%s%s", s.doc, s.line, a.err, a.stdout, a.stderr)
		return
	}
	if !s.hasOut {
		if !json.Valid([]byte(a.stdout)) {
			w.errorf("%s:%d: output is not JSON:\n%s", s.doc, s.line, a.stdout)
		}
		return
	}
	var problem error
	switch {
	case wantError:
		problem = w.compareError(expected, a.stderr+a.stdout)
	case strings.HasPrefix(expected, "{"):
		problem = w.compareJSON(expected, a.stdout)
	default:
		problem = compareLines(expected, a.stdout)
	}
	if problem != nil {
		w.errorf("%s:%d: the README's output does not match the service's:\n%v\n--- README shows:\n%s\n--- the service answered:\n%s%s",
			s.doc, s.line, problem, expected, a.stdout, a.stderr)
	}
}

func compareLines(expected, actual string) error {
	want := strings.Split(strings.TrimSpace(expected), "\n")
	got := strings.Split(strings.TrimSpace(actual), "\n")
	for i := range want {
		want[i] = strings.TrimSpace(want[i])
	}
	for i := range got {
		got[i] = strings.TrimSpace(got[i])
	}
	if !reflect.DeepEqual(want, got) {
		return fmt.Errorf("lines differ")
	}
	return nil
}

func (w *walk) compareJSON(expected, actual string) error {
	want, err := decodeJSON(expected)
	if err != nil {
		return fmt.Errorf("the README's output is not JSON: %v", err)
	}
	got, err := decodeJSON(actual)
	if err != nil {
		return fmt.Errorf("the service's output is not JSON: %v", err)
	}
	var problems []string
	w.diff("", want, got, &problems)
	if len(problems) > 0 {
		sort.Strings(problems)
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

func decodeJSON(s string) (any, error) {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

// diff compares want (the README's) with got (the service's) and appends one
// line per difference.
func (w *walk) diff(path string, want, got any, problems *[]string) {
	switch wv := want.(type) {
	case map[string]any:
		gv, ok := got.(map[string]any)
		if !ok {
			*problems = append(*problems, fmt.Sprintf("%s: README shows an object, the service answered %v", path, got))
			return
		}
		for k, v := range wv {
			g, ok := gv[k]
			if !ok {
				*problems = append(*problems, fmt.Sprintf("%s/%s: README shows it, the service does not answer it", path, k))
				continue
			}
			switch {
			case volatileTimes[k]:
				if s, ok := g.(string); !ok || !isTimestamp(s) {
					*problems = append(*problems, fmt.Sprintf("%s/%s: not a timestamp: %v", path, k, g))
				}
				if s, ok := v.(string); !ok || !isTimestamp(s) {
					*problems = append(*problems, fmt.Sprintf("%s/%s: the README's value is not a timestamp: %v", path, k, v))
				}
			case boundValues[k]:
				w.bind(path+"/"+k, fmt.Sprint(v), fmt.Sprint(g), problems)
			default:
				w.diff(path+"/"+k, v, g, problems)
			}
		}
		for k := range gv {
			if _, ok := wv[k]; !ok {
				*problems = append(*problems, fmt.Sprintf("%s/%s: the service answers it (%v), README does not show it", path, k, gv[k]))
			}
		}
	case []any:
		gv, ok := got.([]any)
		if !ok || len(gv) != len(wv) {
			*problems = append(*problems, fmt.Sprintf("%s: README shows %d elements, the service answered %v", path, len(wv), got))
			return
		}
		for i := range wv {
			w.diff(fmt.Sprintf("%s[%d]", path, i), wv[i], gv[i], problems)
		}
	default:
		if !reflect.DeepEqual(want, got) {
			*problems = append(*problems, fmt.Sprintf("%s: README shows %v, the service answered %v", path, want, got))
		}
	}
}

// bind records that the README's value stands for this run's, or checks that
// it still does (a fencing token is the same across responses).
func (w *walk) bind(path, readme, actual string, problems *[]string) {
	if prev, ok := w.bound[readme]; ok {
		if prev != actual {
			*problems = append(*problems, fmt.Sprintf("%s: where the README shows %s again, the service answered %s, not %s as before", path, readme, actual, prev))
		}
		return
	}
	for r, a := range w.bound {
		if a == actual {
			*problems = append(*problems, fmt.Sprintf("%s: the service answered %s, as it did where the README shows %s, but the README shows %s here", path, actual, r, readme))
			return
		}
	}
	w.bound[readme] = actual
}

func isTimestamp(s string) bool {
	_, err := time.Parse(time.RFC3339Nano, s)
	return err == nil
}

// grpcError is grpcurl's rendering of a failed call.
type grpcError struct {
	code, message string
	details       []string // JSON
}

// parseGrpcError reads
//
//	ERROR:
//	  Code: FailedPrecondition
//	  Message: ...
//	  Details:
//	  1)	{
//	    	  "@type": ...
//	    	}
func parseGrpcError(s string) (grpcError, error) {
	var e grpcError
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if strings.TrimSpace(lines[0]) != "ERROR:" {
		return e, fmt.Errorf("not a grpcurl error: %q", s)
	}
	var details []*strings.Builder
	for _, l := range lines[1:] {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "Code: "):
			e.code = strings.TrimPrefix(t, "Code: ")
		case strings.HasPrefix(t, "Message: "):
			e.message = strings.TrimPrefix(t, "Message: ")
		case t == "Details:":
		case detailStart.MatchString(t): // "1)\t{"
			_, rest, _ := strings.Cut(t, "\t")
			details = append(details, &strings.Builder{})
			details[len(details)-1].WriteString(rest + "\n")
		case len(details) > 0 && strings.Contains(l, "\t"): // "    \t  ..."
			_, rest, _ := strings.Cut(l, "\t")
			details[len(details)-1].WriteString(rest + "\n")
		default:
			return e, fmt.Errorf("unexpected line in a grpcurl error: %q", l)
		}
	}
	for _, d := range details {
		e.details = append(e.details, d.String())
	}
	return e, nil
}

var detailStart = regexp.MustCompile(`^\d+\)\t`)

func (w *walk) compareError(expected, actual string) error {
	want, err := parseGrpcError(expected)
	if err != nil {
		return fmt.Errorf("README: %v", err)
	}
	got, err := parseGrpcError(actual)
	if err != nil {
		return fmt.Errorf("service: %v", err)
	}
	var problems []string
	if want.code != got.code {
		problems = append(problems, fmt.Sprintf("Code: README shows %s, the service answered %s", want.code, got.code))
	}
	if want.message != got.message {
		problems = append(problems, fmt.Sprintf("Message: README shows %q, the service answered %q", want.message, got.message))
	}
	if len(want.details) != len(got.details) {
		problems = append(problems, fmt.Sprintf("Details: README shows %d, the service answered %d", len(want.details), len(got.details)))
	} else {
		for i := range want.details {
			if err := w.compareJSON(want.details[i], got.details[i]); err != nil {
				problems = append(problems, fmt.Sprintf("Details %d: %v", i+1, err))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}
