package ledger

import (
	"encoding/base64"
	"fmt"
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
				if again := base64.RawURLEncoding.EncodeToString([]byte(cursor)); again != tok {
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
		if got, ok := decodePageToken(base64.RawURLEncoding.EncodeToString([]byte(member))); !ok || got != member {
			t.Fatalf("member %q comes back as %q, %v", member, got, ok)
		}
	})
}
