package polyglot

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/ledgertest"
)

// verifyWithJose verifies a receipt with the jose package (the Node
// example's), not the ledger's code: it prints the payload, and fails on a
// bad signature.
const verifyWithJose = `
import { compactVerify, createLocalJWKSet } from 'jose';
import { readFileSync } from 'node:fs';
const [receipt, jwks] = process.argv.slice(-2).map((f) => readFileSync(f, 'utf8').trim());
const keys = createLocalJWKSet(JSON.parse(jwks));
const { payload, protectedHeader } = await compactVerify(receipt, keys, { algorithms: ['EdDSA'] });
if (protectedHeader.typ !== 'opledger-receipt+jws') throw new Error('typ ' + protectedHeader.typ);
console.log(new TextDecoder().decode(payload));
`

// TestReceiptsVerifiedOffline: ledgerd signs with the first of its keys
// (made by ledgerd keygen --receipts) and serves both as a JWKS; the
// receipt of a Complete over HTTP verifies offline with the jose npm
// package and with ledgerctl verify-receipt, and a tampered one is refused
// by both.
func TestReceiptsVerifiedOffline(t *testing.T) {
	node, err := exec.LookPath("node")
	need(t, err == nil, "node is not on PATH")
	nodeDir := filepath.Join(repoRoot(t), "examples", "node")
	_, err = os.Stat(filepath.Join(nodeDir, "node_modules", "jose"))
	need(t, err == nil, "examples/node/node_modules is not installed (npm ci --prefix examples/node)")
	dir := t.TempDir()
	ledgerd := ledgertest.LedgerdBinary(t, tmpDir)
	var files []string
	for _, kid := range []string{"r-2026-12", "r-2026-06"} {
		out, err := exec.Command(ledgerd, "keygen", "--receipts", "--id", kid).Output()
		if err != nil {
			t.Fatalf("keygen --receipts: %v", err)
		}
		files = append(files, filepath.Join(dir, kid+".jwk"))
		if err := os.WriteFile(files[len(files)-1], out, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, httpAddr := startLedgerdHTTP(t, "--receipt-keys", strings.Join(files, ","), "--receipt-issuer", "ledgerd-polyglot")
	post := func(path, body string) map[string]any {
		t.Helper()
		resp, err := http.Post("http://"+httpAddr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("POST %s: %d %v", path, resp.StatusCode, err)
		}
		return out
	}
	res := post("/v1/operations/wf-1:refund:reserve", `{"tool":"payments.refund","params":{"amount":5},"holder":"h-1"}`)
	token := res["operation"].(map[string]any)["fencingToken"].(string)
	done := post("/v1/operations/wf-1:refund:complete", `{"fencing_token":"`+token+`","outcome":"OUTCOME_SUCCEEDED","result":{"resource_id":"re_1"}}`)
	receiptFile := filepath.Join(dir, "receipt.jws")
	if err := os.WriteFile(receiptFile, []byte(done["receipt"].(string)), 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + httpAddr + "/.well-known/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	jwks, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var set struct{ Keys []map[string]any }
	if err := json.Unmarshal(jwks, &set); err != nil || len(set.Keys) != 2 || bytes.Contains(jwks, []byte(`"d"`)) {
		t.Fatalf("JWKS %s: %v", jwks, err)
	}
	jwksFile := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(jwksFile, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	// The same receipt with another resource id in its payload.
	parts := strings.Split(done["receipt"].(string), ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	forged := strings.Replace(string(payload), `"re_1"`, `"re_2"`, 1)
	tamperedFile := filepath.Join(dir, "tampered.jws")
	if err := os.WriteFile(tamperedFile, []byte(parts[0]+"."+base64.RawURLEncoding.EncodeToString([]byte(forged))+"."+parts[2]), 0o600); err != nil {
		t.Fatal(err)
	}

	jose := func(file string) ([]byte, error) {
		cmd := exec.Command(node, "--input-type=module", "-e", verifyWithJose, file, jwksFile)
		cmd.Dir = nodeDir
		cmd.Env = cleanEnv()
		return cmd.CombinedOutput()
	}
	out, err := jose(receiptFile)
	if err != nil || !strings.Contains(string(out), `"resource_id":"re_1"`) || !strings.Contains(string(out), `"iss":"ledgerd-polyglot"`) {
		t.Fatalf("jose: %v\n%s", err, out)
	}
	if out, err := jose(tamperedFile); err == nil {
		t.Fatalf("jose verified a tampered receipt:\n%s", out)
	}
	ledgerctl := ledgertest.LedgerctlBinary(t, tmpDir)
	out, err = exec.Command(ledgerctl, "verify-receipt", receiptFile, "--jwks", jwksFile).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"state": "STATE_SUCCEEDED"`) {
		t.Fatalf("ledgerctl verify-receipt: %v\n%s", err, out)
	}
	cmd := exec.Command(ledgerctl, "verify-receipt", tamperedFile, "--jwks", jwksFile)
	out, err = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "RECEIPT_INVALID") {
		t.Fatalf("ledgerctl verify-receipt of a tampered receipt: %v\n%s", err, out)
	}
}
