package fingerprint

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Fingerprint is the SHA-256 digest identifying the consequential parameters
// of an operation, as computed by Compute. Two requests carrying
// the same operation id must have equal fingerprints; a retry whose
// fingerprint differs changed its parameters.
//
// Its text form (String, Parse) is 64 hexadecimal digits, written
// in lowercase.
type Fingerprint [32]byte

// String returns f as 64 lowercase hexadecimal digits.
func (f Fingerprint) String() string {
	return hex.EncodeToString(f[:])
}

// Parse parses the text form of a Fingerprint: exactly 64
// hexadecimal digits. Upper- and lowercase digits are both accepted.
func Parse(s string) (Fingerprint, error) {
	var f Fingerprint
	if len(s) != 2*len(f) {
		return Fingerprint{}, fmt.Errorf("fingerprint: fingerprint must be %d hex digits, got %d characters", 2*len(f), len(s))
	}
	if _, err := hex.Decode(f[:], []byte(s)); err != nil {
		return Fingerprint{}, errors.New("fingerprint: fingerprint is not hexadecimal")
	}
	return f, nil
}

// ErrInvalidPointer is wrapped by the errors ValidatePointer and
// Compute return for a syntactically invalid RFC 6901 JSON
// pointer. Such an error indicates a bad fingerprint policy, not bad request
// parameters.
var ErrInvalidPointer = errors.New("fingerprint: invalid JSON pointer")

// ValidatePointer checks that p is a syntactically valid RFC 6901 JSON
// pointer usable in a fingerprint field list: it is "" (the whole document)
// or starts with "/", every "~" is followed by "0" or "1", and it is valid
// UTF-8. The returned error wraps ErrInvalidPointer.
func ValidatePointer(p string) error {
	if p == "" {
		return nil
	}
	if p[0] != '/' {
		return fmt.Errorf("%w %q: must be empty or start with '/'", ErrInvalidPointer, p)
	}
	if !utf8.ValidString(p) {
		return fmt.Errorf("%w %q: not valid UTF-8", ErrInvalidPointer, p)
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '~' && (i+1 >= len(p) || (p[i+1] != '0' && p[i+1] != '1')) {
			return fmt.Errorf("%w %q: '~' at byte %d must be followed by '0' or '1'", ErrInvalidPointer, p, i)
		}
	}
	return nil
}

// Compute returns the fingerprint of an operation's consequential
// parameters: SHA-256 of the RFC 8785 canonical JSON of params (decoded
// JSON; nil is {}), or, when fields lists RFC 6901 pointers, of the object
// with one member per pointer that selects a value, named by the pointer as
// written ({"/amount":12.5,"/currency":"EUR"}). docs/design.md
// ("Fingerprint") gives the rule in full, for other languages.
//
// It returns an error wrapping ErrInvalidPointer for a bad pointer
// (ValidatePointer) and ErrNotCanonical for parameters without a canonical
// form; messages name pointers, never values.
func Compute(params map[string]any, fields []string) (Fingerprint, error) {
	e := getEncoder()
	defer putEncoder(e)
	if len(fields) == 0 {
		if err := e.value(params, 0); err != nil {
			return Fingerprint{}, err.finish("")
		}
		return sha256.Sum256(e.buf), nil
	}
	for _, p := range fields {
		if err := ValidatePointer(p); err != nil {
			return Fingerprint{}, err
		}
	}
	ptrs := slices.Clone(fields)
	slices.SortFunc(ptrs, CompareUTF16) // the selection object's member order
	ptrs = slices.Compact(ptrs)

	e.buf = append(e.buf, '{')
	first := true
	for _, p := range ptrs {
		v, ntok, found, perr := resolvePointer(params, p)
		if perr != nil {
			return Fingerprint{}, perr
		}
		if !found {
			continue
		}
		if !first {
			e.buf = append(e.buf, ',')
		}
		first = false
		e.buf = appendString(e.buf, p)
		e.buf = append(e.buf, ':')
		// The selected value lies inside ntok containers of params, so depth
		// is counted exactly as it is when canonicalizing the whole params.
		if err := e.value(v, ntok); err != nil {
			return Fingerprint{}, err.finish(p)
		}
	}
	e.buf = append(e.buf, '}')
	return sha256.Sum256(e.buf), nil
}

// Resolve returns the value the JSON pointer p (RFC 6901) selects in root,
// as Compute selects it, and whether it selects one. An invalid pointer,
// or one past MaxDepth, selects nothing.
func Resolve(root map[string]any, p string) (any, bool) {
	if ValidatePointer(p) != nil {
		return nil, false
	}
	v, _, found, err := resolvePointer(root, p)
	return v, found && err == nil
}

// resolvePointer evaluates the valid JSON pointer p against root. It returns
// the selected value, the number of reference tokens in p, and whether p
// selects anything. It fails only when the walk would enter a container
// nested deeper than MaxDepth.
func resolvePointer(root map[string]any, p string) (v any, ntok int, found bool, err error) {
	var cur any = root
	rest := p
	for rest != "" {
		// Here cur is the value selected by p[:len(p)-len(rest)], which lies
		// inside ntok containers; if it is a container its depth is ntok+1.
		prefix := p[:len(p)-len(rest)]
		rest = rest[1:] // p is valid, so rest starts with '/'
		tok := rest
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			tok, rest = rest[:i], rest[i:]
		} else {
			rest = ""
		}
		ntok++
		switch c := cur.(type) {
		case map[string]any:
			if ntok > MaxDepth {
				return nil, 0, false, tooDeep(prefix)
			}
			if strings.IndexByte(tok, '~') >= 0 {
				tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			}
			x, ok := c[tok]
			if !ok {
				return nil, 0, false, nil
			}
			cur = x
		case []any:
			if ntok > MaxDepth {
				return nil, 0, false, tooDeep(prefix)
			}
			i, ok := arrayIndex(tok)
			if !ok || i >= len(c) {
				return nil, 0, false, nil
			}
			cur = c[i]
		default:
			// A token applied to a scalar (or to an unsupported type, which
			// is not descended into) selects nothing.
			return nil, 0, false, nil
		}
	}
	return cur, ntok, true, nil
}

func tooDeep(path string) error {
	return fmt.Errorf("%w: nesting exceeds MaxDepth at %q", ErrNotCanonical, path)
}

// arrayIndex parses an RFC 6901 array index: "0" or a decimal number without
// leading zeros. "-" and anything else is not an index.
func arrayIndex(tok string) (int, bool) {
	if tok == "" || len(tok) > 1 && tok[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return 0, false
		}
	}
	i, err := strconv.Atoi(tok)
	if err != nil {
		return 0, false // overflow
	}
	return i, true
}
