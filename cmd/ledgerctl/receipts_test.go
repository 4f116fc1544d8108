package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opledger/ledger/receipt"
)

// TestOfflineCommands: verify-receipt and jwks work on files alone, and say
// what is wrong with bad input, with the exit status of a usage error (2)
// or of a failure (1). help answers for each offline command, and one
// given after a global flag is told to come first.
func TestOfflineCommands(t *testing.T) {
	dir := t.TempDir()
	key, _ := receipt.NewKey("k-1")
	b, _ := key.MarshalJWK()
	keyFile := filepath.Join(dir, "k-1.jwk")
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("k-1.jwk", b)
	signer, _ := receipt.NewSigner("ctl-test", []*receipt.Key{key})
	jws, _ := signer.Sign(receipt.Claims{OperationID: "wf-1", State: "STATE_SUCCEEDED"})
	receiptFile := write("r.jws", []byte(jws+"\n"))
	var set bytes.Buffer
	if code := run(context.Background(), []string{"jwks", keyFile}, &set, &bytes.Buffer{}, noEnv); code != exitOK ||
		strings.Contains(set.String(), `"d"`) {
		t.Fatalf("jwks: %d %s", code, set.String())
	}
	jwksFile := write("jwks.json", set.Bytes())
	other, _ := receipt.NewKey("k-1")
	ob, _ := json.Marshal(receipt.JWKS([]*receipt.Key{other}))
	otherFile := write("other.json", ob)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"verify-receipt", receiptFile, "--jwks", jwksFile}, exitOK, `"operation_id": "wf-1"`},
		{[]string{"verify-receipt", receiptFile, "--jwks", otherFile}, exitError, "RECEIPT_INVALID"},
		{[]string{"verify-receipt", write("junk.jws", []byte("junk")), "--jwks", jwksFile}, exitError, "RECEIPT_INVALID"},
		{[]string{"verify-receipt", receiptFile, "--jwks", keyFile}, exitError,
			"JWKS_UNREADABLE: " + keyFile + " is a private key, not a JWK Set: keep it secret; \"ledgerctl jwks " + keyFile + "\" prints the set of its public key"},
		{[]string{"verify-receipt", receiptFile, "--jwks", write("private.json", []byte(`{"keys":[`+string(b)+`]}`))}, exitError,
			`private.json holds a private key (kid "k-1"): keep the file secret, and verify with the public keys (ledgerctl jwks KEYFILE prints them)`},
		{[]string{"verify-receipt", receiptFile, "--jwks", write("public.jwk", set.Bytes()[strings.Index(set.String(), "[")+1:strings.LastIndex(set.String(), "]")])}, exitError,
			`public.jwk is one key, not a JWK Set: put it in {"keys": [...]}`},
		{[]string{"verify-receipt", receiptFile, "--jwks", write("empty.json", []byte(`{"keys":[]}`))}, exitError, "empty.json is not a JWK Set: it has no keys"},
		{[]string{"verify-receipt", receiptFile, "--jwks", write("array.json", []byte(`[]`))}, exitError, "array.json is not a JWK Set: not a JSON object ({...}): an array"},
		{[]string{"verify-receipt", receiptFile, "--jwks", write("bad-key.json", []byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"!"}]}`))}, exitError, "bad-key.json is not a JWK Set: "},
		{[]string{"verify-receipt", filepath.Join(dir, "missing"), "--jwks", jwksFile}, exitError, "RECEIPT_UNREADABLE"},
		{[]string{"verify-receipt", receiptFile}, exitUsage, "needs a receipt FILE and --jwks FILE"},
		{[]string{"verify-receipt", "--jwks", jwksFile}, exitUsage, "needs a receipt FILE"},
		{[]string{"verify-receipt", "-h"}, exitOK, "usage: ledgerctl verify-receipt"},
		{[]string{"jwks"}, exitUsage, "jwks needs a key file"},
		{[]string{"jwks", jwksFile}, exitError, "KEY_UNREADABLE: " + jwksFile + ": a JWK Set, not one key"},
		{[]string{"help", "verify-receipt"}, exitOK, "usage: ledgerctl verify-receipt FILE --jwks FILE"},
		{[]string{"help", "verify-history"}, exitOK, "usage: ledgerctl verify-history FILE"},
		{[]string{"help", "jwks"}, exitOK, "usage: ledgerctl jwks KEYFILE"},
		{[]string{"-h", "jwks"}, exitOK, "usage: ledgerctl jwks KEYFILE"},
		{[]string{"--json", "verify-receipt", "-h"}, exitOK, "usage: ledgerctl verify-receipt FILE"},
		{[]string{"--json", "verify-receipt", receiptFile, "--jwks", jwksFile}, exitUsage, "verify-receipt reads files only and takes no global flags: give it first"},
		{[]string{"--addr", "127.0.0.1:1", "jwks", keyFile}, exitUsage, "jwks reads files only and takes no global flags"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), c.args, &stdout, &stderr, noEnv)
		if code != c.code || !strings.Contains(stdout.String()+stderr.String(), c.want) {
			t.Errorf("%v: exit %d, %s%s; want %d with %q", c.args, code, stdout.String(), stderr.String(), c.code, c.want)
		}
	}
}

func noEnv(string) string { return "" }
