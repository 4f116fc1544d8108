// Package yamlnull finds the mapping keys of a YAML document that YAML
// reads as null: null, Null, NULL, ~, a key left empty or tagged !!null, or
// an alias (*n) of such a null. Decoding drops the entry of such a key
// without a word, in a struct as in a map, and yaml.v3's KnownFields does
// not report it: a configuration file holding one would be loaded without
// that entry. The credentials file and the policy file refuse it instead.
package yamlnull

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Key is a mapping key that YAML reads as null.
type Key struct {
	// Line is the key's line in the document, from 1.
	Line int
	// Value is the key as written ("~", "NULL"; for an alias, what it
	// stands for), "" when the key is left empty.
	Value string
	// Place is the place of the mapping that holds the key, as the name
	// function given to Find writes it ("" for the top level).
	Place string
}

// Written returns the key as an error names it: quoted (`"~"`), or "left
// empty".
func (k Key) Written() string {
	if k.Value == "" {
		return "left empty"
	}
	return fmt.Sprintf("%q", k.Value)
}

// Child is the default name of a mapping's entry key under the place
// parent: the key itself at the top level, else parent.key ("defaults",
// "tools[0].match"). The entries of a sequence are always parent[i].
func Child(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// Find returns the first mapping key of the YAML document data that YAML
// reads as null, in document order; false when there is none, or when data
// is not YAML (its decoding refused it already). Every mapping is looked at
// where it is written: a mapping merged into another one (<<) as part of
// it, at its place; an alias is not followed, since what it stands for is
// written elsewhere. name names the place of a mapping's entry from the
// place of the mapping and the entry's key (nil is Child).
func Find(data []byte, name func(parent, key string) string) (Key, bool) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return Key{}, false
	}
	if name == nil {
		name = Child
	}
	return find(&doc, "", name)
}

// find returns the first null key in n, a node at place.
func find(n *yaml.Node, place string, name func(parent, key string) string) (Key, bool) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if k, ok := find(c, place, name); ok {
				return k, true
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if k, ok := find(c, fmt.Sprintf("%s[%d]", place, i), name); ok {
				return k, true
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if IsMergeKey(k) {
				// The merged mappings' keys are this mapping's.
				merged := []*yaml.Node{v}
				if v.Kind == yaml.SequenceNode {
					merged = v.Content
				}
				for _, m := range merged {
					if k, ok := find(m, place, name); ok {
						return k, true
					}
				}
				continue
			}
			if k.ShortTag() == "!!null" {
				return Key{Line: k.Line, Value: deref(k).Value, Place: place}, true
			}
			var s string
			if k.Decode(&s) != nil {
				continue // not a name: decoding refused the document already
			}
			if k, ok := find(v, name(place, s), name); ok {
				return k, true
			}
		}
	}
	return Key{}, false
}

// IsMergeKey reports whether the mapping key k is YAML's merge key (<<),
// as the decoder recognises it: a quoted "<<" is a name.
func IsMergeKey(k *yaml.Node) bool {
	return k.Kind == yaml.ScalarNode && k.Value == "<<" && (k.Tag == "" || k.Tag == "!" || k.ShortTag() == "!!merge")
}

// deref returns the node an alias stands for, or n itself.
func deref(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}
