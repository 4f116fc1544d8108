package fingerprint

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// MaxDepth is the maximum nesting depth of objects and arrays accepted
// by Canonical and Compute. The outermost object or array is at
// depth 1, a container directly inside it at depth 2, and so on; a container
// at a depth greater than MaxDepth is refused with ErrNotCanonical.
// Scalars inside a container at depth MaxDepth are accepted.
const MaxDepth = 64

// ErrNotCanonical is the sentinel wrapped by every error Canonical and
// Compute return for a value that has no RFC 8785 canonical form
// (NaN or infinite numbers, strings or member names that are not valid UTF-8,
// unsupported Go types, nesting deeper than MaxDepth). Test with
// errors.Is. The error message names the RFC 6901 JSON pointer of the offending
// element but never contains the element's value.
var ErrNotCanonical = errors.New("fingerprint: value has no canonical JSON form")

// Canonical returns the RFC 8785 (JSON Canonicalization Scheme) encoding
// of v, built from what decoding JSON into an any gives (map[string]any,
// []any, string, float64, bool, nil; also int, int64 and json.Number when
// exact as a double). A nil map encodes as {} and a nil slice as [].
// Members are sorted by UTF-16 code units; strings and numbers are written
// as ECMAScript's JSON.stringify writes them.
//
// A value without a canonical form yields an error wrapping
// ErrNotCanonical; its message names the value's JSON pointer, never the
// value.
func Canonical(v any) ([]byte, error) {
	e := encoder{buf: make([]byte, 0, 256)}
	if err := e.value(v, 0); err != nil {
		return nil, err.finish("")
	}
	return e.buf, nil
}

// encoder appends canonical JSON to buf.
type encoder struct {
	buf []byte
	// keys holds one reusable key slice per nesting depth, so that sibling
	// objects at the same depth share a backing array.
	keys [][]string
}

// encoders holds encoders between calls of Compute, which only hashes
// their output.
var encoders = sync.Pool{New: func() any { return &encoder{buf: make([]byte, 0, 256)} }}

// maxPooledBuf is the largest buffer an encoder keeps in the pool.
const maxPooledBuf = 64 << 10

// getEncoder returns an empty encoder from the pool.
func getEncoder() *encoder {
	e := encoders.Get().(*encoder)
	e.buf = e.buf[:0]
	return e
}

// putEncoder returns e to the pool, unless its buffer grew past
// maxPooledBuf. It drops the member names an object left on error.
func putEncoder(e *encoder) {
	if cap(e.buf) > maxPooledBuf {
		return
	}
	for i, k := range e.keys {
		clear(k[:cap(k)])
		e.keys[i] = k[:0]
	}
	encoders.Put(e)
}

// pathError is the internal error of the encoder. The path is collected
// while the recursion unwinds, innermost segment first, and turned into a
// JSON pointer only once, by finish.
type pathError struct {
	reason string
	rev    []string // unescaped reference tokens, innermost first
}

// finish converts e to the public error, prefixing the path with prefix (an
// already escaped JSON pointer, possibly "").
func (e *pathError) finish(prefix string) error {
	var b strings.Builder
	b.WriteString(prefix)
	for i := len(e.rev) - 1; i >= 0; i-- {
		b.WriteByte('/')
		b.WriteString(escapePointerToken(e.rev[i]))
	}
	// %q keeps the message printable even if a member name on the path holds
	// control characters. Path tokens are always valid UTF-8: member names are
	// validated before the encoder descends into their values.
	return fmt.Errorf("%w: %s at %q", ErrNotCanonical, e.reason, b.String())
}

func (e *pathError) at(token string) *pathError {
	e.rev = append(e.rev, token)
	return e
}

func newPathError(reason string) *pathError {
	return &pathError{reason: reason}
}

// value appends the canonical form of v. depth is the number of containers
// enclosing v.
func (e *encoder) value(v any, depth int) *pathError {
	switch x := v.(type) {
	case nil:
		e.buf = append(e.buf, "null"...)
	case bool:
		if x {
			e.buf = append(e.buf, "true"...)
		} else {
			e.buf = append(e.buf, "false"...)
		}
	case string:
		if !utf8.ValidString(x) {
			return newPathError("string is not valid UTF-8")
		}
		e.buf = appendString(e.buf, x)
	case float64:
		return e.number(x)
	case int:
		return e.integer(int64(x))
	case int64:
		return e.integer(x)
	case json.Number:
		if !isJSONNumber(string(x)) {
			return newPathError("json.Number is not a valid JSON number")
		}
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			// Syntax is checked above, so this is a range error (overflow).
			return newPathError("number is out of the IEEE 754 double range")
		}
		return e.number(f)
	case map[string]any:
		return e.object(x, depth+1)
	case []any:
		return e.array(x, depth+1)
	default:
		return newPathError(fmt.Sprintf("unsupported Go type %T", v))
	}
	return nil
}

func (e *encoder) integer(i int64) *pathError {
	const maxExact = 1 << 53
	if i > maxExact || i < -maxExact {
		return newPathError("integer is not exactly representable as an IEEE 754 double")
	}
	return e.number(float64(i))
}

func (e *encoder) number(f float64) *pathError {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return newPathError("number is NaN or infinite")
	}
	e.buf = appendNumber(e.buf, f)
	return nil
}

func (e *encoder) object(m map[string]any, depth int) *pathError {
	if depth > MaxDepth {
		return newPathError("nesting exceeds MaxDepth")
	}
	if len(m) == 0 {
		e.buf = append(e.buf, "{}"...)
		return nil
	}
	if len(e.keys) < depth {
		if e.keys == nil {
			e.keys = make([][]string, 0, 8)
		}
		for len(e.keys) < depth {
			e.keys = append(e.keys, nil)
		}
	}
	keys := e.keys[depth-1][:0]
	if cap(keys) < len(m) {
		keys = make([]string, 0, len(m))
	}
	for k := range m {
		if !utf8.ValidString(k) {
			// The name is not part of the path: it is the bad element.
			return newPathError("object member name is not valid UTF-8")
		}
		keys = append(keys, k)
	}
	slices.SortFunc(keys, CompareUTF16)
	e.buf = append(e.buf, '{')
	for i, k := range keys {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		e.buf = appendString(e.buf, k)
		e.buf = append(e.buf, ':')
		if err := e.value(m[k], depth); err != nil {
			return err.at(k)
		}
	}
	e.buf = append(e.buf, '}')
	// Keep the (possibly grown) slice for the next object at this depth, but
	// drop the string references so the map's keys can be collected.
	clear(keys)
	e.keys[depth-1] = keys[:0]
	return nil
}

func (e *encoder) array(a []any, depth int) *pathError {
	if depth > MaxDepth {
		return newPathError("nesting exceeds MaxDepth")
	}
	e.buf = append(e.buf, '[')
	for i, x := range a {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		if err := e.value(x, depth); err != nil {
			return err.at(strconv.Itoa(i))
		}
	}
	e.buf = append(e.buf, ']')
	return nil
}

// CompareUTF16 orders valid UTF-8 strings by their UTF-16 code units, as
// RFC 8785 section 3.2.3 requires. UTF-8 byte order equals code point order,
// which differs from UTF-16 order only when a supplementary-plane character
// (encoded as a surrogate pair, 0xD800-0xDFFF) meets a BMP character in
// U+E000-U+FFFF. It returns a number below 0 when a sorts first, 0 when
// they are equal, and one above 0 when b sorts first.
func CompareUTF16(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b) // one is a prefix of the other
	}
	// Back up to the start of the character holding the first difference;
	// a[:i] == b[:i], so it starts at the same offset in both strings.
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, _ := utf8.DecodeRuneInString(a[i:])
	rb, _ := utf8.DecodeRuneInString(b[i:])
	if ra == rb {
		// Only possible for invalid UTF-8, which callers reject; fall back to
		// byte order to stay a consistent total order.
		return strings.Compare(a, b)
	}
	// Within the BMP, and among supplementary characters, UTF-16 order is
	// code point order. A supplementary character's first code unit is a
	// high surrogate (0xD800-0xDBFF); valid UTF-8 holds no BMP surrogates,
	// so comparing the BMP character against 0xD800 decides the order.
	if ra >= 0x10000 && rb < 0x10000 {
		ra = 0xD800
	} else if rb >= 0x10000 && ra < 0x10000 {
		rb = 0xD800
	}
	return int(ra) - int(rb)
}

// appendString appends s (valid UTF-8) as a JSON string escaped like
// ECMAScript's JSON.stringify.
func appendString(buf []byte, s string) []byte {
	const hex = "0123456789abcdef"
	buf = append(buf, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		buf = append(buf, s[start:i]...)
		switch c {
		case '"':
			buf = append(buf, '\\', '"')
		case '\\':
			buf = append(buf, '\\', '\\')
		case '\b':
			buf = append(buf, '\\', 'b')
		case '\t':
			buf = append(buf, '\\', 't')
		case '\n':
			buf = append(buf, '\\', 'n')
		case '\f':
			buf = append(buf, '\\', 'f')
		case '\r':
			buf = append(buf, '\\', 'r')
		default:
			buf = append(buf, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
		start = i + 1
	}
	buf = append(buf, s[start:]...)
	return append(buf, '"')
}

// appendNumber appends the ECMAScript Number.prototype.toString form of the
// finite number f (RFC 8785 section 3.2.2.3).
func appendNumber(buf []byte, f float64) []byte {
	if f == 0 {
		return append(buf, '0') // also -0
	}
	abs := math.Abs(f)
	if abs >= 1e-6 && abs < 1e21 {
		// Fixed notation with the shortest digits that round-trip. 1e21 is an
		// exact double, and 1e-6 here is the same double the shortest
		// representation "0.000001" parses to, so these bounds match
		// ECMAScript's decision on the decimal exponent.
		return strconv.AppendFloat(buf, f, 'f', -1, 64)
	}
	start := len(buf)
	buf = strconv.AppendFloat(buf, f, 'e', -1, 64)
	// Go writes at least two exponent digits ("1e-07"); ECMAScript writes
	// none with a leading zero ("1e-7"). The exponent here is >= 21 or <= -7.
	ePos := -1
	for i := len(buf) - 1; i > start; i-- {
		if buf[i] == 'e' {
			ePos = i
			break
		}
	}
	if ePos >= 0 && ePos+2 < len(buf) && buf[ePos+2] == '0' {
		buf = append(buf[:ePos+2], buf[ePos+3:]...)
	}
	return buf
}

// isJSONNumber reports whether s matches the JSON number grammar of
// RFC 8259 section 6.
func isJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i >= len(s) || !isDigit(s[i]) {
			return false
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) || !isDigit(s[i]) {
			return false
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	return i == len(s)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// escapePointerToken escapes a reference token for use in an RFC 6901 JSON
// pointer ("~" becomes "~0", "/" becomes "~1").
func escapePointerToken(t string) string {
	if !strings.ContainsAny(t, "~/") {
		return t
	}
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(t)
}
