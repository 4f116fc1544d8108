package chain

import "testing"

// The vectors were computed with printf and sha1sum over the documented
// bytes (docs/receipts.md, "The history chain"), not with this package.
func TestLink(t *testing.T) {
	reserved := Entry{TimeMillis: 1764633600000, To: 1, Reason: "RESERVED", FencingToken: 1764633600000, Principal: "alice"}
	claimed := Entry{TimeMillis: 1764633600250, From: 1, To: 2, Reason: "CLAIMED", Attempt: 1, FencingToken: 1764633600250, Principal: "alice"}
	for _, tc := range []struct {
		name string
		prev string
		e    Entry
		want string
	}{
		{"first entry", Genesis, reserved, "97cf7642aa0e4fef5f30a12bfdd0e0ba1d8d0929"},
		{"second entry", "97cf7642aa0e4fef5f30a12bfdd0e0ba1d8d0929", claimed, "b80bbd867342d3660f451e87b830bc363683dda7"},
		{"detail and non-ASCII text", Genesis,
			Entry{TimeMillis: 1, From: 5, To: 3, Reason: "RECONCILED_APPLIED", Attempt: 2, FencingToken: 9, Principal: "opérateur", Detail: "le débit a eu lieu"},
			"8015b5b98dd31ec33e0471f03894de57c74c8b5f"},
	} {
		if got := Link(tc.prev, tc.e); got != tc.want {
			t.Errorf("%s: Link = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestValues(t *testing.T) {
	a := Entry{TimeMillis: 1764633600000, To: 1, Reason: "RESERVED", FencingToken: 1764633600000, Principal: "alice"}
	b := Entry{TimeMillis: 1764633600250, From: 1, To: 2, Reason: "CLAIMED", Attempt: 1, FencingToken: 1764633600250, Principal: "alice"}
	moved := b
	moved.Principal, moved.Detail = "alic", "e" // the same bytes but for where the separator falls
	whole := Values("", []Entry{a, b})
	for _, tc := range []struct {
		name    string
		base    string
		entries []Entry
		want    []string
	}{
		{"no entries", "", nil, []string{Genesis}},
		{"from the genesis", "", []Entry{a, b}, whole},
		{"from a base that absorbed the first entry", whole[1], []Entry{b}, whole[1:]},
	} {
		got := Values(tc.base, tc.entries)
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %d values, want %d", tc.name, len(got), len(tc.want))
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s: value %d = %s, want %s", tc.name, i, got[i], tc.want[i])
			}
		}
		if h := Head(tc.base, tc.entries); h != tc.want[len(tc.want)-1] {
			t.Errorf("%s: Head = %s, want the last value", tc.name, h)
		}
	}
	if whole[2] != "b80bbd867342d3660f451e87b830bc363683dda7" {
		t.Errorf("head = %s, want the vector of TestLink", whole[2])
	}
	for _, changed := range []Entry{moved, {TimeMillis: b.TimeMillis + 1, From: 1, To: 2, Reason: "CLAIMED", Attempt: 1, FencingToken: b.FencingToken, Principal: "alice"}} {
		if Head("", []Entry{a, changed}) == whole[2] {
			t.Errorf("a changed entry %+v kept the head", changed)
		}
	}
	if Head("", []Entry{b}) == whole[2] || Head("", []Entry{b, a}) == whole[2] {
		t.Error("a dropped or reordered entry kept the head")
	}
}

// BenchmarkHead is the chain of a SUCCEEDED operation's two entries.
func BenchmarkHead(b *testing.B) {
	entries := []Entry{
		{TimeMillis: 1764633600000, To: 2, Reason: "RESERVED", Attempt: 1, FencingToken: 1764633600000, Principal: "agent-1"},
		{TimeMillis: 1764633600250, From: 2, To: 3, Reason: "SUCCEEDED", Attempt: 1, FencingToken: 1764633600000, Principal: "agent-1"},
	}
	b.ReportAllocs()
	for b.Loop() {
		Head("", entries)
	}
}
