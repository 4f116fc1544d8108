package ledger

import (
	"fmt"
	"strings"
	"testing"
)

// FuzzDecodePageToken: a ListUnresolved page token is untrusted input. It
// decodes only to an index member ("<13-digit creation time>:<operation
// id>", the id one the ledger accepts), and only when it is exactly the
// token ListUnresolved would have written for that member; every member
// the index can hold survives the round trip.
func FuzzDecodePageToken(f *testing.F) {
	for _, s := range []string{
		"", "MTcwMDAwMDAwMDAwMDphLTE", "MTcwMDAwMDAwMDAwMDphLTE=", "MTcwMDAwMDAwMDAwMDo", "not a token", "////", "-_-_",
	} {
		f.Add(s, int64(1700000000000), "wf-8472:create-ticket")
	}
	f.Fuzz(func(t *testing.T, tok string, createdMs int64, id string) {
		cursor, ok := decodePageToken(tok)
		if ok {
			if (tok == "") != (cursor == "") {
				t.Fatalf("token %q decodes to %q", tok, cursor)
			}
			if tok != "" {
				if again := encodePageToken(cursor); again != tok {
					t.Fatalf("token %q decodes to %q, whose token is %q", tok, cursor, again)
				}
				if len(cursor) < 15 || cursor[13] != ':' {
					t.Fatalf("token %q decodes to %q, not an index member", tok, cursor)
				}
				if err := ValidateOperationID(cursor[14:]); err != nil {
					t.Fatalf("token %q decodes to %q, whose id is refused: %v", tok, cursor, err)
				}
			}
		} else if cursor != "" {
			t.Fatalf("refused token %q decodes to %q", tok, cursor)
		}
		if createdMs < 0 || createdMs > 9999999999999 || ValidateOperationID(id) != nil {
			return
		}
		member := fmt.Sprintf("%013d:%s", createdMs, id)
		if got, ok := decodePageToken(encodePageToken(member)); !ok || got != member {
			t.Fatalf("member %q comes back as %q, %v", member, got, ok)
		}
	})
}

// TestDecodePageTokenRefusesOtherSpellings: the base64 decoder ignores line
// breaks and the low bits of the last character; a token spelled so, or
// naming no valid operation id, is not one the ledger wrote.
func TestDecodePageTokenRefusesOtherSpellings(t *testing.T) {
	good := encodePageToken("1700000000000:a-1")
	if c, ok := decodePageToken(good); !ok || c != "1700000000000:a-1" {
		t.Fatalf("%q: %q, %v", good, c, ok)
	}
	for _, tok := range []string{
		"MTcwMDAwMDAwMDAwMDphLTF",             // low bits set
		"MTcwMDAwMDAwMDAwMDph\nLTE",           // a line break
		"MTcwMDAwMDAwMDAwMDphLTE\r\n",         // a trailing CRLF
		encodePageToken("1700000000000:\n"),   // a control character
		encodePageToken("1700000000000:\xff"), // not UTF-8
		encodePageToken("1700000000000:" + strings.Repeat("a", MaxOperationIDLen+1)),
	} {
		if c, ok := decodePageToken(tok); ok {
			t.Errorf("%q decodes to %q", tok, c)
		}
	}
}
