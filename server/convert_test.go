package server

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/opledger/ledger/fingerprint"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestStructMapRefusals pins what structMap refuses and how it names the
// place: a JSON pointer to the value (RFC 6901 escapes), never the value.
func TestStructMapRefusals(t *testing.T) {
	nan := structpb.NewNumberValue(math.NaN())
	list := func(v ...*structpb.Value) *structpb.Value {
		return structpb.NewListValue(&structpb.ListValue{Values: v})
	}
	obj := func(k string, v *structpb.Value) *structpb.Value {
		return structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{k: v}})
	}
	deep := structpb.NewNullValue()
	for range 70 {
		deep = obj("x", deep)
	}
	cases := []struct {
		name string
		in   *structpb.Value
		want string
	}{
		{"NaN", obj("a", obj("b~/c", list(structpb.NewNumberValue(1), nan))), `number is NaN or infinite at "/a/b~0~1c/1"`},
		{"infinity", obj("", structpb.NewNumberValue(math.Inf(-1))), `number is NaN or infinite at "/"`},
		{"no kind", obj("x", list(structpb.NewNullValue(), &structpb.Value{})), `value without a kind at "/x/1"`},
		{"too deep", deep, `nested deeper than 64 levels at "` + strings.Repeat("/x", 64) + `"`},
	}
	for _, c := range cases {
		var errs requestErrors
		m, ok := structMap("params", c.in.GetStructValue(), &errs)
		if ok || m != nil || len(errs) != 1 || errs[0].Field != "params" {
			t.Fatalf("%s: %v, %v, %v", c.name, m, ok, errs)
		}
		if errs[0].Description != c.want {
			t.Errorf("%s: %q, want %q", c.name, errs[0].Description, c.want)
		}
	}
}

// FuzzStructParams: for any Struct a client can send as JSON, the edge's
// conversion never panics, agrees with structpb's own conversion (JSON holds
// no NaN or infinity, the one place they differ), and fingerprints the same.
func FuzzStructParams(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"amount":42,"currency":"EUR"}`, `{"a":{"b":[1,2,{"c":null}]}}`,
		`{"x":1e308,"y":-0,"z":5e-324}`, `{"k~/":"v","":true}`, `{"€":"\u2028"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &structpb.Struct{}
		if err := protojson.Unmarshal(data, s); err != nil {
			return
		}
		var errs requestErrors
		m, ok := structMap("params", s, &errs)
		if !ok {
			if len(errs) != 1 || !bytes.Contains([]byte(errs[0].Description), []byte("nested deeper")) {
				t.Fatalf("refused %s: %v", data, errs)
			}
			return
		}
		if want := s.AsMap(); !reflect.DeepEqual(m, want) {
			t.Fatalf("structMap(%s) = %v, AsMap = %v", data, m, want)
		}
		a, errA := fingerprint.Canonical(m)
		b, errB := fingerprint.Canonical(s.AsMap())
		if (errA == nil) != (errB == nil) || !bytes.Equal(a, b) {
			t.Fatalf("canonical forms differ: %s / %s (%v, %v)", a, b, errA, errB)
		}
	})
}
