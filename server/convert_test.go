package server

import (
	"math"
	"strings"
	"testing"

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
