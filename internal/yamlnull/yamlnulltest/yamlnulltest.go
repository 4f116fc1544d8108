// Package yamlnulltest is the fuzz tests' oracle for yamlnull: a plain walk
// of a YAML document, written apart from yamlnull.Find, that says whether
// any mapping key in it reads as null. The fuzz targets of the files that
// refuse such keys (the credentials file, the policy file) check that no
// file they accept holds one.
package yamlnulltest

import "go.yaml.in/yaml/v3"

// NullMappingKey returns the line of a mapping key anywhere in data (a YAML
// document) that reads as null, as a key itself or as the alias of one.
func NullMappingKey(data []byte) (int, bool) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return 0, false
	}
	seen := map[*yaml.Node]bool{}
	var walk func(n *yaml.Node) (int, bool)
	walk = func(n *yaml.Node) (int, bool) {
		if n == nil || seen[n] {
			return 0, false
		}
		seen[n] = true
		if n.Kind == yaml.MappingNode {
			for i := 0; i < len(n.Content); i += 2 {
				k := n.Content[i]
				if k.Kind == yaml.AliasNode && k.Alias != nil && k.Alias.ShortTag() == "!!null" || k.ShortTag() == "!!null" {
					return k.Line, true
				}
			}
		}
		if line, ok := walk(n.Alias); ok {
			return line, true
		}
		for _, c := range n.Content {
			if line, ok := walk(c); ok {
				return line, true
			}
		}
		return 0, false
	}
	return walk(&doc)
}
