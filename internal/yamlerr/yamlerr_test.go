package yamlerr

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type upstream struct {
	Name    string        `yaml:"name"`
	Command []string      `yaml:"command"`
	Retries int           `yaml:"retries"`
	Ratio   float64       `yaml:"ratio"`
	On      bool          `yaml:"on"`
	Wait    time.Duration `yaml:"wait"`
	Env     map[string]string
	Nested  struct{ A int } `yaml:"nested"`
}

// TestReadable: yaml.v3's errors for a file decoded into upstream, worded
// for the file, with no Go type in them.
func TestReadable(t *testing.T) {
	for _, c := range []struct {
		doc, want string
	}{
		{"name: a\ncomand: [x]\n", "line 2: unknown field comand"},
		{"retries: abc\n", "line 1: retries: text where a whole number belongs"},
		{"ratio: [1]\n", "line 1: ratio: a list where a number belongs"},
		{"on: maybe\n", "line 1: on: text where true or false belongs"},
		{"wait: 5x\n", "line 1: wait: text where a duration (30s, 5m, 1h) belongs"},
		{"command: {a: 1}\n", "line 1: command: a mapping where a list belongs"},
		{"env: 3\n", "line 1: env: a whole number where a mapping belongs"},
		{"nested: x\n", "line 1: nested: text where a mapping belongs"},
		{"nested: {a: x}\n", "line 1: a: text where a whole number belongs"},
		{"nested: {a: 1}\nwait: 5x\nname: n\n", "line 2: wait: text where a duration (30s, 5m, 1h) belongs"},
		{"{name: n, retries: x}\n", "line 1: text where a whole number belongs"},
		{"name: [a]\nretries: x\n", "line 1: name: a list where text belongs; line 2: retries: text where a whole number belongs"},
	} {
		dec := yaml.NewDecoder(strings.NewReader(c.doc))
		dec.KnownFields(true)
		var u upstream
		err := Readable(dec.Decode(&u), []byte(c.doc))
		if err == nil || err.Error() != c.want {
			t.Errorf("%q: %v, want %q", c.doc, err, c.want)
		}
	}
	other := errors.New("yaml: line 1: did not find expected key")
	if got := Readable(other, nil); got != other {
		t.Errorf("another error: %v, want it as it is", got)
	}
	if Readable(nil, nil) != nil {
		t.Error("Readable(nil) is not nil")
	}
}
