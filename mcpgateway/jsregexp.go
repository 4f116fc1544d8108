package mcpgateway

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// jsRegexp compiles a schema's regular expression (a pattern, a
// patternProperties key, a value of format regex) as the TypeScript
// client reads it: JavaScript's syntax with the u flag, which AJV uses.
// It returns an error for one JavaScript cannot compile, so that a tool
// whose schema has one is served without it, as the client could not
// list it; for one it can, but Go cannot match alike (a lookaround, a
// back reference), so that the check is never laxer than the client's;
// and for one the Python client's re cannot compile or reads as other
// characters (a named group, \p{...}, \u{...}, \c, [], a surrogate
// pair), on which that client would raise. ., \s and \S match as in
// JavaScript; Go's own differ on \r and on Unicode's spaces.
func jsRegexp(p string) (jsonschema.Regexp, error) {
	t := &jsTranslator{src: []rune(p)}
	if err := t.disjunction(); err != nil {
		return nil, fmt.Errorf("pattern %q: %w", p, err)
	}
	if t.i < len(t.src) {
		return nil, fmt.Errorf("pattern %q: an unmatched )", p)
	}
	return regexp.Compile(t.out.String())
}

var (
	errNotMatchedAlike = errors.New("JavaScript matches it in a way Go does not")
	// errNotPortable is for what Python's re, which the Python client's
	// validator uses, cannot compile or reads otherwise: that client would
	// raise on every call of the tool.
	errNotPortable = errors.New("the re module of Python cannot read it alike")
)

// jsAnyButLineEnd is JavaScript's . in Go.
const jsAnyButLineEnd = `[^\n\r\x{2028}\x{2029}]`

// jsTranslator writes a JavaScript expression, read from src at i, as Go's.
type jsTranslator struct {
	src []rune
	i   int
	out strings.Builder
}

func (t *jsTranslator) more() bool { return t.i < len(t.src) }

func (t *jsTranslator) peek() rune {
	if t.more() {
		return t.src[t.i]
	}
	return -1
}

// has reports whether src continues with s at i.
func (t *jsTranslator) has(s string) bool {
	j := t.i
	for _, r := range s {
		if j >= len(t.src) || t.src[j] != r {
			return false
		}
		j++
	}
	return true
}

// upTo returns the runes from i to the next end, and whether there is one.
func (t *jsTranslator) upTo(end rune) (string, bool) {
	for j := t.i; j < len(t.src); j++ {
		if t.src[j] == end {
			return string(t.src[t.i:j]), true
		}
	}
	return "", false
}

// disjunction reads alternatives up to a ) or the end.
func (t *jsTranslator) disjunction() error {
	for {
		for t.more() && t.peek() != '|' && t.peek() != ')' {
			if err := t.term(); err != nil {
				return err
			}
		}
		if t.peek() != '|' {
			return nil
		}
		t.i++
		t.out.WriteByte('|')
	}
}

// term reads an assertion, or an atom and its quantifier.
func (t *jsTranslator) term() error {
	switch c := t.peek(); {
	case c == '^' || c == '$':
		t.i++
		t.out.WriteRune(c)
		return t.noQuantifier()
	case t.has(`\b`) || t.has(`\B`):
		return fmt.Errorf("a word boundary, of ASCII words in JavaScript and Unicode's in Python: %w", errNotPortable)
	}
	if err := t.atom(); err != nil {
		return err
	}
	return t.quantifier()
}

// noQuantifier refuses a quantifier after an assertion.
func (t *jsTranslator) noQuantifier() error {
	if c := t.peek(); c == '*' || c == '+' || c == '?' || c == '{' {
		return errors.New("nothing to repeat")
	}
	return nil
}

// atom reads one atom.
func (t *jsTranslator) atom() error {
	c := t.peek()
	t.i++
	switch c {
	case '.':
		t.out.WriteString(jsAnyButLineEnd)
	case '\\':
		return t.escape()
	case '[':
		return t.class()
	case '(':
		return t.group()
	case '*', '+', '?', '{', '}', ']':
		return fmt.Errorf("a lone %c", c)
	default:
		t.out.WriteString(regexp.QuoteMeta(string(c)))
	}
	return nil
}

// group reads a group after its (. It refuses a named group, which
// Python's re writes (?P<name>...).
func (t *jsTranslator) group() error {
	switch {
	case t.has("?="), t.has("?!"), t.has("?<="), t.has("?<!"):
		return fmt.Errorf("a lookaround: %w", errNotMatchedAlike)
	case t.has("?<"):
		return fmt.Errorf("a named group: %w", errNotPortable)
	case t.has("?:"):
		t.i += 2
		t.out.WriteString("(?:")
	case t.has("?"):
		return errors.New("an invalid group")
	default:
		t.out.WriteByte('(')
	}
	if err := t.disjunction(); err != nil {
		return err
	}
	if t.peek() != ')' {
		return errors.New("an unterminated group")
	}
	t.i++
	t.out.WriteByte(')')
	return nil
}

var (
	quantifier = regexp.MustCompile(`^\{(\d+)(,(\d*))?\}$`)
)

// quantifier reads an atom's quantifier, if any. Go refuses counts over
// 1000; so does this.
func (t *jsTranslator) quantifier() error {
	switch c := t.peek(); c {
	case '*', '+', '?':
		t.i++
		t.out.WriteRune(c)
	case '{':
		body, _ := t.upTo('}')
		m := quantifier.FindStringSubmatch(body + "}")
		if m == nil {
			return errors.New("an incomplete quantifier")
		}
		lo, err1 := strconv.Atoi(m[1])
		hi, err2 := lo, error(nil)
		if m[3] != "" {
			hi, err2 = strconv.Atoi(m[3])
		}
		switch {
		case err1 != nil || err2 != nil || lo > 1000 || hi > 1000:
			return fmt.Errorf("a count over 1000: %w", errNotMatchedAlike)
		case hi < lo:
			return errors.New("numbers out of order in a quantifier")
		}
		t.i += len([]rune(m[0]))
		t.out.WriteString(m[0])
	default:
		return nil
	}
	if t.peek() == '?' {
		t.i++
		t.out.WriteByte('?')
	}
	return nil
}

// escape reads an escape outside a class, after its \.
func (t *jsTranslator) escape() error {
	c := t.peek()
	switch {
	case c >= '1' && c <= '9' || c == 'k':
		return fmt.Errorf("a back reference: %w", errNotMatchedAlike)
	case c == 'W':
		t.i++
		t.out.WriteString(`[^\p{L}\p{N}_]`)
		return nil
	case strings.ContainsRune("dDwsS", c):
		t.i++
		t.out.WriteString("[" + classSet(c, false) + "]")
		return nil
	}
	set, err := t.classEscape(false)
	if err != nil {
		return err
	}
	t.out.WriteString(set)
	return nil
}

// classSet returns, as the items of a Go class, what \c (one of dDwWsS)
// matches in a class, negated or not, for an answer both clients take:
// JavaScript's sets are ASCII's, Python's re's Unicode's, so a set is the
// smaller of the two, or, in a negated class, the larger. "" when no class
// items can say it (\W in a class that is not negated).
func classSet(c rune, negated bool) string {
	if negated {
		return classSets[c][1]
	}
	return classSets[c][0]
}

// classSets are classSet's answers: in a class, and in a negated class.
var classSets = map[rune][2]string{
	'd': {`0-9`, `\p{Nd}`},
	'D': {`\P{Nd}`, `\D`},
	'w': {`0-9A-Za-z_`, `\p{L}\p{N}_`},
	'W': {"", `\W`},
	's': {spaceInBoth, spaceInEither},
	'S': {complement(spaceInEither), complement(spaceInBoth)},
}

// classEscape reads an escape after its \ and returns it in Go's syntax,
// valid in a class and out of one; in a class, \b is a backspace and \-
// a hyphen.
func (t *jsTranslator) classEscape(inClass bool) (string, error) {
	if !t.more() {
		return "", errors.New("a \\ at the end")
	}
	c := t.src[t.i]
	t.i++
	switch {
	case c == 'p' || c == 'P':
		return "", fmt.Errorf("a property escape: %w", errNotPortable)
	case c == 'b' && inClass:
		return `\x{8}`, nil
	case c == '-' && inClass, strings.ContainsRune(`^$\.*+?()[]{}|/`, c):
		return hexRune(c), nil
	}
	r, err := t.characterEscape(c)
	if err != nil {
		return "", err
	}
	return hexRune(r), nil
}

// characterEscape returns the character an escape of c stands for.
func (t *jsTranslator) characterEscape(c rune) (rune, error) {
	switch c {
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'v':
		return '\v', nil
	case '0':
		if d := t.peek(); d >= '0' && d <= '9' {
			return 0, errors.New("an octal escape")
		}
		return 0, nil
	case 'c':
		if l := t.peek(); l >= 'a' && l <= 'z' || l >= 'A' && l <= 'Z' {
			return 0, fmt.Errorf("a control escape: %w", errNotPortable)
		}
		return 0, errors.New("an invalid control escape")
	case 'x':
		return t.hex(2)
	case 'u':
		return t.unicodeEscape()
	}
	return 0, fmt.Errorf("an invalid escape \\%c", c)
}

// hex reads n hex digits.
func (t *jsTranslator) hex(n int) (rune, error) {
	if t.i+n > len(t.src) {
		return 0, errors.New("an invalid escape")
	}
	v, err := strconv.ParseUint(string(t.src[t.i:t.i+n]), 16, 32)
	if err != nil {
		return 0, errors.New("an invalid escape")
	}
	t.i += n
	return rune(v), nil
}

// unicodeEscape reads \u{...}, or \uXXXX and its low surrogate if it is a
// high one, after the u.
func (t *jsTranslator) unicodeEscape() (rune, error) {
	if t.peek() == '{' {
		t.i++
		digits, ok := t.upTo('}')
		if v, err := strconv.ParseUint(digits, 16, 32); !ok || err != nil || v > unicode.MaxRune {
			return 0, errors.New("an invalid unicode escape")
		}
		return 0, fmt.Errorf("a \\u{...} escape: %w", errNotPortable)
	}
	r, err := t.hex(4)
	if err != nil || r < 0xD800 || r > 0xDBFF || !t.has(`\u`) {
		if err == nil {
			return surrogateFree(r)
		}
		return 0, err
	}
	t.i += 2
	if lo, err := t.hex(4); err != nil || lo < 0xDC00 || lo > 0xDFFF {
		return 0, fmt.Errorf("a lone surrogate: %w", errNotMatchedAlike)
	}
	return 0, fmt.Errorf("a surrogate pair, two characters to Python: %w", errNotPortable)
}

// surrogateFree refuses a lone surrogate, which no valid UTF-8 string has.
func surrogateFree(r rune) (rune, error) {
	if r >= 0xD800 && r <= 0xDFFF {
		return 0, fmt.Errorf("a lone surrogate: %w", errNotMatchedAlike)
	}
	return r, nil
}

// class reads a character class after its [.
func (t *jsTranslator) class() error {
	negate := t.peek() == '^'
	if negate {
		t.i++
	}
	var items strings.Builder
	for t.peek() != ']' {
		if !t.more() {
			return errors.New("an unterminated class")
		}
		lo, single, err := t.classAtom(negate)
		if err != nil {
			return err
		}
		if t.peek() != '-' || t.i+1 >= len(t.src) || t.src[t.i+1] == ']' {
			items.WriteString(lo)
			continue
		}
		t.i++ // a range
		hi, hiSingle, err := t.classAtom(negate)
		if err != nil {
			return err
		}
		if single < 0 || hiSingle < 0 {
			return errors.New("a class escape in a range")
		}
		if hiSingle < single {
			return errors.New("a range out of order")
		}
		items.WriteString(lo + "-" + hi)
	}
	t.i++
	switch {
	case items.Len() == 0:
		return fmt.Errorf("an empty class: %w", errNotPortable)
	case negate:
		t.out.WriteString("[^" + items.String() + "]")
	default:
		t.out.WriteString("[" + items.String() + "]")
	}
	return nil
}

// classAtom reads one atom of a class, negated or not, and returns it in
// Go's syntax, with the character it stands for; -1 for a set (\d, \s).
func (t *jsTranslator) classAtom(negated bool) (string, rune, error) {
	c := t.src[t.i]
	t.i++
	if c != '\\' {
		return hexRune(c), c, nil
	}
	if c := t.peek(); c >= 0 && strings.ContainsRune("dDwWsS", c) {
		t.i++
		set := classSet(c, negated)
		if set == "" {
			return "", 0, fmt.Errorf("\\%c in a class: %w", c, errNotPortable)
		}
		return set, -1, nil
	}
	s, err := t.classEscape(true)
	if err != nil {
		return "", 0, err
	}
	r, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(s, `\x{`), "}"), 16, 32)
	return s, rune(r), nil
}

// hexRune is r as Go's \x{...}, which means r in a class and out of one.
func hexRune(r rune) string { return fmt.Sprintf(`\x{%x}`, r) }

// The characters \s matches in both clients, and in either: JavaScript
// has U+FEFF, Python's re U+001C to U+001F and U+0085.
const (
	spaceInBoth   = `\x{9}-\x{d}\x{20}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}`
	spaceInEither = `\x{9}-\x{d}\x{1c}-\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}\x{feff}`
)

// complement returns the characters set (class items, single characters
// and ranges in order) does not hold, as class items, surrogates left
// out, since no valid UTF-8 string has them.
func complement(set string) string {
	var b strings.Builder
	next := rune(0)
	emit := func(to rune) { // from next up to to, without surrogates
		for _, r := range [][2]rune{{next, min(to, 0xD7FF)}, {max(next, 0xE000), to}} {
			if r[0] <= r[1] {
				b.WriteString(hexRune(r[0]) + "-" + hexRune(r[1]))
			}
		}
	}
	for _, m := range classItem.FindAllStringSubmatch(set, -1) {
		lo, _ := strconv.ParseUint(m[1], 16, 32)
		hi := lo
		if m[2] != "" {
			hi, _ = strconv.ParseUint(m[2], 16, 32)
		}
		emit(rune(lo) - 1)
		next = rune(hi) + 1
	}
	emit(unicode.MaxRune)
	return b.String()
}

var classItem = regexp.MustCompile(`\\x\{([0-9a-f]+)\}(?:-\\x\{([0-9a-f]+)\})?`)
