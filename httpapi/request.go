package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/opledger/ledger/internal/jsonvalue"
)

// invalidPrefix begins the message of every request this package refuses,
// as the service's own INVALID_ARGUMENT messages begin; the field named
// after it becomes the BadRequest violation (errorHandler).
const invalidPrefix = "invalid request: "

// invalid is the error of a request refused for field: desc.
func invalid(field, desc string) error {
	return errors.New(invalidPrefix + field + ": " + desc)
}

// marshaler is protojson's, with body errors that name where the body
// went wrong, never what it holds (a parameter's value, say).
type marshaler struct{ runtime.JSONPb }

// NewDecoder returns the JSON decoder of a request body.
func (m *marshaler) NewDecoder(r io.Reader) runtime.Decoder {
	pb, _ := r.(pathBody)
	return decoder{json.NewDecoder(r), &m.JSONPb, pb.params}
}

// pathBody is a request's body with the parameters of its path, which
// the path sets after the body is decoded (pathParams).
type pathBody struct {
	io.ReadCloser
	params map[string]string
}

// pathParams is a grpc-gateway middleware of gw, run before any call: it
// refuses a path or query that is not UTF-8 (ids and filters are protobuf
// strings), a query naming another value for a path parameter (which
// grpc-gateway would drop) and a query parameter the route does not read,
// and hands the path's parameters to the body's decoder.
type pathParams struct {
	gw *runtime.ServeMux
	rt *routes
}

func (p *pathParams) middleware(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		q, err := utf8Query(r.URL)
		if err == nil {
			err = otherInQuery(q, params)
		}
		if err == nil && len(q) > 0 {
			err = knownQuery(q, params, p.rt.find(r, r.Method))
		}
		if err != nil {
			_, out := runtime.MarshalerForRequest(p.gw, r)
			errorHandler(r.Context(), p.gw, out, w, r, status.Error(codes.InvalidArgument, err.Error()))
			return
		}
		if len(params) > 0 && r.Body != nil {
			r.Body = pathBody{r.Body, params}
		}
		next(w, r, params)
	}
}

// knownQuery returns the error of the first query parameter, by name,
// that rt does not read. A route whose request is its body reads none
// (grpc-gateway drops them): only a path parameter may be repeated there.
// Another reads the fields of its request, the path's among them.
func knownQuery(q url.Values, params map[string]string, rt route) error {
	if rt.request == nil {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		switch {
		case rt.body && !isPathParam(k, params):
			return invalid(k, "no such query parameter (this path's request is its body)")
		case !rt.body && !hasField(rt.request, k):
			return invalid(k, "no such query parameter")
		}
	}
	return nil
}

// isPathParam reports whether key names a path parameter by its proto or
// JSON name.
func isPathParam(key string, params map[string]string) bool {
	for name := range params {
		if key == name || key == jsonName(name) {
			return true
		}
	}
	return false
}

// otherInQuery returns the error of a query parameter that names a path
// parameter, by its proto or JSON name, with another value.
func otherInQuery(q url.Values, params map[string]string) error {
	for _, name := range slices.Sorted(maps.Keys(params)) {
		for _, key := range []string{name, jsonName(name)} {
			for _, v := range q[key] {
				if v != params[name] {
					return invalid(name, fmt.Sprintf("the query's %q differs from the path's %q", v, params[name]))
				}
			}
		}
	}
	return nil
}

// jsonName is protobuf's JSON name of the field name: run_id is runId.
func jsonName(name string) string {
	var b strings.Builder
	upper := false
	for _, c := range name {
		switch {
		case c == '_':
			upper = true
		case upper && 'a' <= c && c <= 'z':
			b.WriteRune(c - 'a' + 'A')
			upper = false
		default:
			b.WriteRune(c)
			upper = false
		}
	}
	return b.String()
}

type decoder struct {
	dec  *json.Decoder
	pb   *runtime.JSONPb
	path map[string]string // the path's parameters
}

// Decode decodes the body, one JSON value, into v; io.EOF stands for an
// empty body. It refuses a body that names another id than the path (the
// path's would silently win), and a number in params or result data that
// a double would carry changed.
func (d decoder) Decode(v any) error {
	var raw json.RawMessage
	err := d.dec.Decode(&raw)
	if errors.Is(err, io.EOF) {
		return err
	}
	if err == nil {
		err = d.pb.Unmarshal(raw, v)
	}
	if err != nil {
		return invalid("body", bodyProblem(err, v))
	}
	var more json.RawMessage
	if err := d.dec.Decode(&more); !errors.Is(err, io.EOF) {
		return invalid("body", "more than one JSON value")
	}
	if m, ok := v.(proto.Message); ok {
		if err := exactNumbers(raw, m.ProtoReflect().Descriptor(), ""); err != nil {
			return err
		}
		return d.samePath(m.ProtoReflect())
	}
	return nil
}

// structName is the message of params and result data.
const structName = "google.protobuf.Struct"

// exactNumbers refuses a number in a Struct field of raw, a body md has
// read, that a double would carry changed: an integer beyond 2^53 written
// other than as its double's digits (9007199254740993), which protojson
// rounds, so that two different requests would share a fingerprint, or a
// result be recorded as another. The same numbers the Go SDK refuses
// (jsonvalue); where names the field (result.data).
func exactNumbers(raw json.RawMessage, md protoreflect.MessageDescriptor, where string) error {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return nil // null: protojson has read it
	}
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		f := md.Fields().ByJSONName(key)
		if f == nil {
			f = md.Fields().ByName(protoreflect.Name(key))
		}
		if f == nil || f.Message() == nil || f.IsList() || f.IsMap() {
			continue
		}
		name := where + string(f.Name())
		if f.Message().FullName() != structName {
			if err := exactNumbers(obj[key], f.Message(), name+"."); err != nil {
				return err
			}
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(obj[key]))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) == nil && jsonvalue.ExactIntegers(v) != nil {
			return invalid(name, "a number no double carries exactly (an integer beyond 2^53); send it as a string")
		}
	}
	return nil
}

// samePath refuses a string field of m that the body set to another value
// than the path's parameter of the same name.
func (d decoder) samePath(m protoreflect.Message) error {
	for _, name := range slices.Sorted(maps.Keys(d.path)) {
		f := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		if f == nil || f.Kind() != protoreflect.StringKind || f.IsList() {
			continue
		}
		if got := m.Get(f).String(); got != "" && got != d.path[name] {
			return invalid(name, fmt.Sprintf("the body's %q differs from the path's %q", got, d.path[name]))
		}
	}
	return nil
}

var (
	protoPosition = regexp.MustCompile(`\(line (\d+):(\d+)\)`)
	namedField    = regexp.MustCompile(`(unknown|duplicate) field "([A-Za-z0-9_]{1,64})"`)
	badValue      = regexp.MustCompile(`invalid value for [a-z0-9 ]*field ([A-Za-z0-9_]{1,64}):`)
)

// bodyProblem describes err, an error decoding a body into v, without
// any of the body's values.
func bodyProblem(err error, v any) string {
	var tooLarge *http.MaxBytesError
	var syntax *json.SyntaxError
	switch {
	case errors.As(err, &tooLarge):
		return fmt.Sprintf("larger than %d bytes", tooLarge.Limit)
	case errors.As(err, &syntax):
		return fmt.Sprintf("not JSON (at byte %d)", syntax.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "not JSON (it ends early)"
	}
	desc := "not a valid request"
	if m, ok := v.(proto.Message); ok {
		desc = "not a valid " + string(proto.MessageName(m))
	}
	msg := err.Error()
	if f := namedField.FindStringSubmatch(msg); f != nil {
		desc = fmt.Sprintf("%s field %q", f[1], f[2])
	} else if f := badValue.FindStringSubmatch(msg); f != nil {
		desc = fmt.Sprintf("not a valid value for field %q", f[1])
	} else if strings.Contains(msg, "invalid UTF-8") {
		desc = "a string not UTF-8"
	}
	if p := protoPosition.FindStringSubmatch(msg); p != nil {
		desc += " (line " + p[1] + ", column " + p[2] + ")"
	}
	return desc
}

// queryParser is grpc-gateway's, naming the parameter whose value it
// cannot read, without the value. A parameter the request has no field
// for never reaches it (knownQuery).
type queryParser struct{ runtime.DefaultQueryParser }

// Parse sets msg's fields from values, except those filter names (bound
// from the path).
func (p *queryParser) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	keys := slices.Sorted(maps.Keys(values))
	if p.DefaultQueryParser.Parse(msg, values, filter) == nil {
		return nil
	}
	for _, k := range keys {
		scratch := msg.ProtoReflect().New().Interface()
		if p.DefaultQueryParser.Parse(scratch, url.Values{k: values[k]}, filter) != nil {
			return invalid(k, "not a valid value")
		}
	}
	return invalid("query", "not valid")
}

// hasField reports whether key (a.b.c, or a[k] for a map) names a field of
// md by its proto or JSON name, as grpc-gateway reads it.
func hasField(md protoreflect.MessageDescriptor, key string) bool {
	if i := strings.IndexByte(key, '['); i >= 0 && strings.HasSuffix(key, "]") {
		key = key[:i]
	}
	parts := strings.Split(key, ".")
	for i, name := range parts {
		fields := md.Fields()
		f := fields.ByName(protoreflect.Name(name))
		if f == nil {
			f = fields.ByJSONName(name)
		}
		if f == nil {
			return false
		}
		if i < len(parts)-1 {
			if f.Message() == nil || f.IsList() || f.IsMap() {
				return false
			}
			md = f.Message()
		}
	}
	return true
}

// utf8Query returns u's query, or the error of the first part of u that
// is not UTF-8: the path, else the first parameter by name.
func utf8Query(u *url.URL) (url.Values, error) {
	if !utf8.ValidString(u.Path) {
		return nil, invalid("path", "not UTF-8")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, invalid("query", "not a valid query string")
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if !utf8.ValidString(k) {
			return nil, invalid("query", "a parameter's name is not UTF-8")
		}
		for _, v := range q[k] {
			if !utf8.ValidString(v) {
				return nil, invalid(k, "not UTF-8")
			}
		}
	}
	return q, nil
}
