package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/receipt"
)

// TestStartReceipts: a key file with a private key that other users may
// read is warned about, naming the file and never the key; a public key,
// or a private one only its owner (and group) may read, is not.
func TestStartReceipts(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, public bool, mode os.FileMode) string {
		k, err := receipt.NewKey(name)
		if err != nil {
			t.Fatal(err)
		}
		if public {
			k = &receipt.Key{ID: k.ID, Public: k.Public}
		}
		b, err := k.MarshalJWK()
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name+".jwk")
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	const warning = "other users may read this receipt signing key"
	for _, tc := range []struct {
		name  string
		files []string
		warns string // the file warned about, "" for none
	}{
		{"owner only", []string{write("a", false, 0o600)}, ""},
		{"group may read", []string{write("b", false, 0o640)}, ""},
		{"others may read", []string{write("c", false, 0o644)}, "c.jwk"},
		{"a verify key others may read", []string{write("d", false, 0o600), write("e", true, 0o644)}, ""},
		{"an old private key others may read", []string{write("f", false, 0o600), write("g", false, 0o604)}, "g.jwk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &ledgertest.Buffer{}
			s, err := startReceipts(config{receiptKeys: strings.Join(tc.files, ","), receiptIssuer: "t"}, slog.New(slog.NewJSONHandler(logs, nil)))
			if err != nil || s == nil {
				t.Fatalf("startReceipts = %v, %v", s, err)
			}
			got := logs.String()
			if strings.Contains(got, warning) != (tc.warns != "") || tc.warns != "" && !strings.Contains(got, tc.warns) || strings.Contains(got, `"d":`) {
				t.Errorf("logs %s; want a warning about %q", got, tc.warns)
			}
		})
	}
}
