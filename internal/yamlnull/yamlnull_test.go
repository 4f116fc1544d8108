package yamlnull

import (
	"fmt"
	"testing"
)

// TestFind: every spelling of a null key is found, with its line, its value
// as written and the place of its mapping, in block and flow style, in a
// sequence, through a merge key and as an alias; a null value, a quoted
// "null", a quoted "<<" and a document without a null key have none.
func TestFind(t *testing.T) {
	for _, name := range []string{"null", "Null", "NULL", "~"} {
		for _, tc := range []struct {
			doc   string
			line  int
			place string
		}{
			{name + ": 1\n", 1, ""},
			{"a:\n  b: 1\n  " + name + ": 2\n", 3, "a"},
			{"a: {b: {c: 1, " + name + ": 2}}\n", 1, "a.b"},
			{"a:\n  - {b: 1}\n  - b: 1\n    " + name + ": 2\n", 4, "a[1]"},
			{"a: {<<: {" + name + ": 1}, b: 2}\n", 1, "a"},
			{"a:\n  <<: [{b: 1}, {" + name + ": 1}]\n", 2, "a"},
			{"a: {b: &n " + name + "}\nc: {*n : 1}\n", 2, "c"},
			{"a: &m {b: 1, " + name + ": 2}\nc: {<<: *m}\n", 1, "a"},
			{"\"<<\": {" + name + ": 1}\n", 1, "<<"},
		} {
			k, ok := Find([]byte(tc.doc), nil)
			if !ok || k.Line != tc.line || k.Place != tc.place || k.Value != name {
				t.Errorf("%q: %+v %v, want %q on line %d at %q", tc.doc, k, ok, name, tc.line, tc.place)
			}
			if want := fmt.Sprintf("%q", name); k.Written() != want {
				t.Errorf("%q: written %s, want %s", tc.doc, k.Written(), want)
			}
		}
	}
	for _, doc := range []string{"a: {? : 1}\n", "a: {!!null '': 1}\n", "a:\n  ? \n  : 1\n"} {
		k, ok := Find([]byte(doc), nil)
		if !ok || k.Place != "a" || k.Value != "" || k.Written() != "left empty" {
			t.Errorf("%q: %+v %v, want a key left empty at a", doc, k, ok)
		}
	}
	for _, doc := range []string{
		"", "# a comment\n", "a: ~\nb: null\n", "\"null\": 1\n'~': 2\n", "a: [~, {b: null}]\n",
		"a: &n ~\nb: *n\n", "a: {\"<<\": {b: 1}}\n", "not: [valid\n", "~\n",
	} {
		if k, ok := Find([]byte(doc), nil); ok {
			t.Errorf("%q: found %+v", doc, k)
		}
	}
}

// TestFindNamesPlaces: the name function names each mapping entry's place
// from its parent's; sequence entries are parent[i].
func TestFindNamesPlaces(t *testing.T) {
	name := func(parent, key string) string {
		if parent == "m" {
			return fmt.Sprintf("m[%q]", key)
		}
		return Child(parent, key)
	}
	k, ok := Find([]byte("m:\n  x:\n    l: [{~: 1}]\n"), name)
	if !ok || k.Place != `m["x"].l[0]` || k.Line != 3 {
		t.Errorf("%+v %v, want m[\"x\"].l[0] on line 3", k, ok)
	}
}
