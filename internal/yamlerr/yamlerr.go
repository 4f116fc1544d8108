// Package yamlerr words yaml.v3's decoding errors in terms of the file
// instead of the Go types it decodes into: "unknown field comand" rather
// than "field comand not found in type mcpgateway.UpstreamConfig".
package yamlerr

import (
	"errors"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

var (
	unknownField = regexp.MustCompile(`^(line \d+: )field (.+) not found in type .+$`)
	wrongKind    = regexp.MustCompile("^(line (\\d+): )cannot unmarshal (!!\\w+)(?: `.*`)? into (.+)$")
)

// kinds names YAML's tags as a file's reader knows them.
var kinds = map[string]string{
	"!!str": "text", "!!int": "a whole number", "!!float": "a number", "!!bool": "true or false",
	"!!seq": "a list", "!!map": "a mapping", "!!null": "null", "!!timestamp": "a time",
}

// Readable returns err, an error of decoding data, with each of a
// *yaml.TypeError's lines worded for the file: the field by its key, and
// the kind of value found and wanted, not the value (it may be a key
// pasted in the wrong place). Any other error, and one whose key it cannot
// find in data, is returned as it is.
func Readable(err error, data []byte) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil {
		return err
	}
	lines := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		l, ok := line(e, &doc)
		if !ok {
			return err
		}
		lines[i] = l
	}
	return errors.New(strings.Join(lines, "; "))
}

// line words one of a TypeError's lines, naming its key when doc has one
// value of its kind on its line; false when doc has none.
func line(e string, doc *yaml.Node) (string, bool) {
	if m := unknownField.FindStringSubmatch(e); m != nil {
		return m[1] + "unknown field " + m[2], true
	}
	m := wrongKind.FindStringSubmatch(e)
	if m == nil {
		return "", false
	}
	n, _ := strconv.Atoi(m[2])
	key := ""
	if found := keys(doc, n, m[3]); len(found) == 1 {
		key = found[0] + ": "
	} else if len(found) == 0 {
		return "", false
	}
	what := kinds[m[3]]
	if what == "" {
		what = "a " + strings.TrimPrefix(m[3], "!!")
	}
	// (Of several values of that kind on the line, which is not known.)
	return m[1] + key + what + " where " + goKind(m[4]) + " belongs", true
}

// keys returns the keys of the mapping entries whose values are on line
// and have tag.
func keys(n *yaml.Node, line int, tag string) []string {
	var found []string
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if v := n.Content[i+1]; v.Line == line && v.ShortTag() == tag {
				found = append(found, n.Content[i].Value)
			}
		}
	}
	for _, c := range n.Content {
		found = append(found, keys(c, line, tag)...)
	}
	return found
}

// goKind names the Go type t as the value a file holds for it.
func goKind(t string) string {
	switch {
	case t == "time.Duration":
		return "a duration (30s, 5m, 1h)"
	case t == "bool":
		return "true or false"
	case t == "string":
		return "text"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["), strings.HasPrefix(t, "struct"):
		return "a mapping"
	}
	return "another kind of value"
}
