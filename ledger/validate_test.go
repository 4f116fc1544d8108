package ledger

import (
	"strings"
	"testing"
)

// TestValidateTool: a tool name is 1 to MaxToolLen bytes of ASCII
// letters, digits and . _ - : /; anything else is KindInvalid, naming the
// field and never echoing the name.
func TestValidateTool(t *testing.T) {
	for _, tc := range []struct {
		name string
		want string // "" for accepted
	}{
		{"tickets.create", ""},
		{"crm/files:read_v2-x", ""},
		{strings.Repeat("t", MaxToolLen), ""},
		{"", "tool: required"},
		{strings.Repeat("t", MaxToolLen+1), "tool: longer than 128 bytes"},
		{"open ticket", "tool: may only hold letters, digits and . _ - : /"},
		{"tickets~create", "tool: may only hold"},
		{"tické", "tool: may only hold"},
		{"a\nb", "tool: may only hold"},
	} {
		err := ValidateTool(tc.name)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("ValidateTool(%q) = %v, want nil", tc.name, err)
		case tc.want != "" && (err == nil || KindOf(err) != KindInvalid || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("ValidateTool(%q) = %v, want KindInvalid saying %q", tc.name, err, tc.want)
		case err != nil && len(tc.name) > 3 && strings.Contains(err.Error(), tc.name):
			t.Errorf("ValidateTool(%q) = %v: the error echoes the name", tc.name, err)
		}
	}
}
