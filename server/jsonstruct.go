package server

import (
	"errors"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// resultStruct turns a recorded result's data (the canonical JSON the ledger
// stored, fingerprint.Canonical's form) back into a Struct for the wire.
// Replays and Lookups do this on every call, so it parses the JSON directly
// into the Struct; whatever that parser does not take (a surrogate escape,
// nesting deeper than it goes) is left to protojson, with the same result.
func resultStruct(data []byte) (*structpb.Struct, error) {
	if s, err := parseJSONStruct(data); err == nil {
		return s, nil
	}
	s := &structpb.Struct{}
	if err := protojson.Unmarshal(data, s); err != nil {
		return nil, err
	}
	return s, nil
}

// jsonMaxDepth bounds the nesting parseJSONStruct follows; deeper documents
// go to protojson (fingerprint.Canonical itself stops at 64 levels).
const jsonMaxDepth = 100

var errJSON = errors.New("not JSON this parser takes")

// parseJSONStruct parses one JSON object (RFC 8259, strict: no trailing
// content, no duplicate member names, valid UTF-8, numbers that fit a
// float64) into a Struct. It never accepts a document protojson would
// refuse or read differently (FuzzParseJSONStruct).
func parseJSONStruct(data []byte) (*structpb.Struct, error) {
	p := jsonParser{b: data}
	p.space()
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return nil, errJSON
	}
	s, err := p.object(1)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.i != len(p.b) {
		return nil, errJSON
	}
	return s, nil
}

type jsonParser struct {
	b []byte
	i int
}

func (p *jsonParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// object parses an object at p.b[p.i] == '{'.
func (p *jsonParser) object(depth int) (*structpb.Struct, error) {
	if depth > jsonMaxDepth {
		return nil, errJSON
	}
	p.i++
	s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return s, nil
	}
	for {
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return nil, errJSON
		}
		k, err := p.string()
		if err != nil {
			return nil, err
		}
		if _, dup := s.Fields[k]; dup {
			return nil, errJSON
		}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return nil, errJSON
		}
		p.i++
		p.space()
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		s.Fields[k] = v
		if done, err := p.after('}'); err != nil {
			return nil, err
		} else if done {
			return s, nil
		}
	}
}

// after reads what follows a member or an element: a comma (more to come)
// or the container's closing byte (done).
func (p *jsonParser) after(closing byte) (done bool, err error) {
	p.space()
	if p.i >= len(p.b) {
		return false, errJSON
	}
	switch p.b[p.i] {
	case ',':
		p.i++
		p.space()
		return false, nil
	case closing:
		p.i++
		return true, nil
	}
	return false, errJSON
}

// value parses the value at p.i, inside a container at depth.
func (p *jsonParser) value(depth int) (*structpb.Value, error) {
	if p.i >= len(p.b) {
		return nil, errJSON
	}
	switch c := p.b[p.i]; {
	case c == '{':
		s, err := p.object(depth + 1)
		if err != nil {
			return nil, err
		}
		return structpb.NewStructValue(s), nil
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.string()
		if err != nil {
			return nil, err
		}
		return structpb.NewStringValue(s), nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case p.literal("true"):
		return structpb.NewBoolValue(true), nil
	case p.literal("false"):
		return structpb.NewBoolValue(false), nil
	case p.literal("null"):
		return structpb.NewNullValue(), nil
	}
	return nil, errJSON
}

func (p *jsonParser) literal(word string) bool {
	if len(p.b)-p.i < len(word) || string(p.b[p.i:p.i+len(word)]) != word {
		return false
	}
	p.i += len(word)
	return true
}

// array parses an array at p.b[p.i] == '['.
func (p *jsonParser) array(depth int) (*structpb.Value, error) {
	if depth > jsonMaxDepth {
		return nil, errJSON
	}
	p.i++
	l := &structpb.ListValue{}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return structpb.NewListValue(l), nil
	}
	for {
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		l.Values = append(l.Values, v)
		if done, err := p.after(']'); err != nil {
			return nil, err
		} else if done {
			return structpb.NewListValue(l), nil
		}
	}
}

// number parses a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
// that a float64 holds.
func (p *jsonParser) number() (*structpb.Value, error) {
	start := p.i
	if p.b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.b) && p.b[p.i] == '0':
		p.i++
	case p.digits() == 0:
		return nil, errJSON
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if p.digits() == 0 {
			return nil, errJSON
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if p.digits() == 0 {
			return nil, errJSON
		}
	}
	f, err := strconv.ParseFloat(string(p.b[start:p.i]), 64)
	if err != nil {
		return nil, errJSON
	}
	return structpb.NewNumberValue(f), nil
}

func (p *jsonParser) digits() int {
	n := 0
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
		n++
	}
	return n
}

// string parses a string at p.b[p.i] == '"'. Escapes of UTF-16 surrogates
// are left to protojson.
func (p *jsonParser) string() (string, error) {
	p.i++
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			raw := p.b[start:p.i]
			p.i++
			if !utf8.Valid(raw) {
				return "", errJSON
			}
			return string(raw), nil
		case c == '\\':
			return p.escaped(start)
		case c < 0x20:
			return "", errJSON
		}
		p.i++
	}
	return "", errJSON
}

// escaped continues a string from its first escape, at p.i.
func (p *jsonParser) escaped(start int) (string, error) {
	buf := append([]byte(nil), p.b[start:p.i]...)
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			if !utf8.Valid(buf) {
				return "", errJSON
			}
			return string(buf), nil
		case c < 0x20:
			return "", errJSON
		case c != '\\':
			buf = append(buf, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.b) {
			return "", errJSON
		}
		switch e := p.b[p.i+1]; e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			if p.i+6 > len(p.b) {
				return "", errJSON
			}
			r, err := strconv.ParseUint(string(p.b[p.i+2:p.i+6]), 16, 32)
			if err != nil || r >= 0xD800 && r <= 0xDFFF {
				return "", errJSON
			}
			buf = utf8.AppendRune(buf, rune(r))
			p.i += 4
		default:
			return "", errJSON
		}
		p.i += 2
	}
	return "", errJSON
}
