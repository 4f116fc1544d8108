package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/chain"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
	"github.com/opledger/ledger/receipt"
)

// TestVerifyHistory: verify-history checks a saved Lookup answer (ledgerctl's
// JSON, or the HTTP API's) and the receipts signed along the way, offline;
// it notices an edited answer, a record rewritten in the store after a
// receipt was signed, and says what is wrong with bad input.
func TestVerifyHistory(t *testing.T) {
	srv := redistest.Shared(t)
	rdb := srv.Client(t)
	key, _ := receipt.NewKey("k-1")
	signer, _ := receipt.NewSigner("ctl-test", []*receipt.Key{key})
	tenant := fmt.Sprintf("verify-%d", time.Now().UnixNano())
	st := servicetest.StartHTTP(t, rdb, servicetest.Options{Policy: ledgertest.Policy, Receipts: signer}, tenant, "vh", nil)
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	call := func(scope, method, path, body string) []byte {
		t.Helper()
		req, _ := http.NewRequest(method, st.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+st.Keys[scope])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return b
	}
	field := func(b []byte, name string) string {
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		s, _ := m[name].(string)
		return s
	}
	ctl := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		env := map[string]string{"LEDGER_ADDR": st.Addr, "LEDGER_API_KEY": st.Keys["viewer"]}
		code := run(context.Background(), args, &stdout, &stderr, func(k string) string { return env[k] })
		return code, stdout.String() + stderr.String()
	}
	lookupJSON := func(name string) string {
		t.Helper()
		code, out := ctl("--tls=false", "lookup", "wf-1:refund", "--json")
		if code != exitOK {
			t.Fatalf("lookup: %d %s", code, out)
		}
		return write(name, []byte(out))
	}

	r := call("agent", "POST", "/v1/operations/wf-1:refund:reserve", `{"tool":"payments.refund","params":{"amount":5},"permit_id":"p-1","holder":"h-1"}`)
	var res struct{ Operation struct{ FencingToken string } }
	_ = json.Unmarshal(r, &res)
	unknown := call("agent", "POST", "/v1/operations/wf-1:refund:markUnknown", `{"fencing_token":"`+res.Operation.FencingToken+`","reason":"gateway timeout"}`)
	applied := call("reconciler", "POST", "/v1/operations/wf-1:refund:reconcile", `{"finding":"FINDING_APPLIED","result":{"resource_id":"re_1"}}`)
	r1, r2 := write("r1.jws", []byte(field(unknown, "receipt"))), write("r2.jws", []byte(field(applied, "receipt")))
	var set bytes.Buffer
	if err := writeJSON(&set, signer.JWKS()); err != nil {
		t.Fatal(err)
	}
	jwks := write("jwks.json", set.Bytes())
	saved := lookupJSON("lookup.json")
	httpAnswer := write("http.json", call("viewer", "GET", "/v1/operations/wf-1:refund", ""))
	edited, _ := os.ReadFile(saved)
	editedFile := write("edited.json", bytes.Replace(edited, []byte("gateway timeout"), []byte("no timeout"), 1))
	other, _ := signer.Sign(receipt.Claims{OperationID: "wf-2:refund", HistoryHead: chain.Genesis})
	otherFile := write("other.jws", []byte(other))
	stranger, _ := receipt.NewKey("k-1")
	strangerSigner, _ := receipt.NewSigner("ctl-test", []*receipt.Key{stranger})
	forged, _ := strangerSigner.Sign(receipt.Claims{OperationID: "wf-1:refund"})
	forgedFile := write("forged.jws", []byte(forged))
	// A history whose oldest entries were dropped, with entries after a
	// receipt whose head is not among its values.
	later := chain.Entry{TimeMillis: time.Now().Add(time.Hour).UnixMilli(), From: 5, To: 3, Reason: "RECONCILED_APPLIED", Attempt: 1, FencingToken: 7, Principal: "ops"}
	base := strings.Repeat("ab", 20)
	truncated := write("truncated.json", []byte(`{"operation_id":"wf-1:refund","history_base":"`+base+`","history_head":"`+chain.Head(base, []chain.Entry{later})+
		`","history":[{"time":"`+time.UnixMilli(later.TimeMillis).UTC().Format(time.RFC3339Nano)+`","from_state":"STATE_UNKNOWN","to_state":"STATE_SUCCEEDED","attempt":1,"fencing_token":7,"principal":"ops","reason":"RECONCILED_APPLIED","detail":""}]}`))
	early, _ := signer.Sign(receipt.Claims{OperationID: "wf-1:refund", HistoryHead: strings.Repeat("cd", 20)})
	earlyFile := write("early.jws", []byte(early))

	cases := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"ledgerctl's JSON and two receipts", []string{saved, "--receipt", r1, "--receipt", r2, "--jwks", jwks}, exitOK,
			[]string{"receipt 1 (STATE_UNKNOWN, attempt 1,", "after entry 2", "receipt 2 (STATE_SUCCEEDED, attempt 1,", "after entry 3", "the history chain checks"}},
		{"the HTTP API's answer with its receipt", []string{httpAnswer, "--receipt", r1, "--jwks", jwks}, exitOK,
			[]string{"receipt 1 (STATE_SUCCEEDED", "receipt 2 (STATE_UNKNOWN", "the history chain checks"}},
		{"without receipts", []string{saved}, exitOK, []string{"base", "RECONCILED_APPLIED", "the history chain checks"}},
		{"an edited answer", []string{editedFile}, exitError, []string{"HISTORY_MISMATCH"}},
		{"a receipt of another operation", []string{saved, "--receipt", otherFile, "--jwks", jwks}, exitError, []string{"RECEIPT_OTHER_OPERATION"}},
		{"a receipt of another key", []string{saved, "--receipt", forgedFile, "--jwks", jwks}, exitError, []string{"RECEIPT_INVALID"}},
		{"a receipt signed before the kept history", []string{truncated, "--receipt", earlyFile, "--jwks", jwks}, exitError, []string{"RECEIPT_BEFORE_KEPT_HISTORY"}},
		{"a receipt without --jwks", []string{saved, "--receipt", r1}, exitError, []string{"JWKS_UNREADABLE"}},
		{"a missing receipt", []string{saved, "--receipt", filepath.Join(dir, "none"), "--jwks", jwks}, exitError, []string{"RECEIPT_UNREADABLE"}},
		{"not a Lookup answer", []string{write("empty.json", []byte(`{}`))}, exitError, []string{"HISTORY_UNREADABLE"}},
		{"not JSON", []string{write("junk.json", []byte(`junk`))}, exitError, []string{"HISTORY_UNREADABLE"}},
		{"a bad entry", []string{write("bad.json", []byte(`{"operation_id":"x","history_head":"0","history":[{"time":"now"}]}`))}, exitError, []string{"HISTORY_UNREADABLE", "entry 1"}},
		{"no file", nil, exitUsage, []string{"verify-history needs a FILE"}},
		{"help", []string{"-h"}, exitOK, []string{"usage: ledgerctl verify-history"}},
	}
	check := func(name string, args []string, code int, want []string) {
		t.Helper()
		got, out := ctl(append([]string{"verify-history"}, args...)...)
		if got != code {
			t.Errorf("%s: exit %d, want %d:\n%s", name, got, code, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", name, w, out)
			}
		}
	}
	for _, c := range cases {
		check(c.name, c.args, c.code, c.want)
	}

	// Past its retention, lookup names the head the tombstone keeps: the
	// one the receipt of its final state signed.
	call("agent", "POST", "/v1/operations/wf-9:compact:reserve", `{"tool":"compact.refund","params":{},"holder":"h-9"}`)
	var tiny struct{ Operation struct{ FencingToken string } }
	_ = json.Unmarshal(call("viewer", "GET", "/v1/operations/wf-9:compact", ""), &tiny)
	final := call("agent", "POST", "/v1/operations/wf-9:compact:complete", `{"fencing_token":"`+tiny.Operation.FencingToken+`","outcome":"OUTCOME_SUCCEEDED"}`)
	finalClaims, err := receipt.Verify(field(final, "receipt"), signer.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		code, out := ctl("--tls=false", "lookup", "wf-9:compact")
		if code == exitError && strings.Contains(out, "IDEMPOTENCY_KEY_EXPIRED") {
			if !strings.Contains(out, "it ended SUCCEEDED; its history chain's head is "+finalClaims.HistoryHead) {
				t.Errorf("expired lookup: %s", out)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never expired: %d %s", code, out)
		}
	}

	// Someone with access to the store rewrites the note: the answer is
	// consistent again, and the receipts signed before no longer fit.
	keys, err := rdb.Keys(context.Background(), "ledger:*:op:"+tenant+":wf-1*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("the record's key: %v %v", keys, err)
	}
	v, _ := rdb.Get(context.Background(), keys[0]).Result()
	if err := rdb.Set(context.Background(), keys[0], strings.Replace(v, "gateway timeout", "no timeout", 1), redis.KeepTTL).Err(); err != nil {
		t.Fatal(err)
	}
	rewritten := lookupJSON("rewritten.json")
	check("a rewritten record", []string{rewritten}, exitOK, []string{"the history chain checks"})
	check("a rewritten record and the receipts before", []string{rewritten, "--receipt", r1, "--receipt", r2, "--jwks", jwks}, exitError,
		[]string{"RECEIPT_NOT_IN_HISTORY: receipt 1", "RECEIPT_NOT_IN_HISTORY: receipt 2"})
}

// FuzzVerifyHistory reads arbitrary bytes as a saved Lookup answer: it never
// panics, and what it reads it checks.
func FuzzVerifyHistory(f *testing.F) {
	f.Add([]byte(`{"operation_id":"wf-1","history_head":"` + chain.Genesis + `","history":[]}`))
	f.Add([]byte(`{"operation":{"operationId":"wf-1","historyHead":"x","history":[{"time":"2026-12-02T06:18:49.506Z","toState":"STATE_RUNNING","fencingToken":"18446744073709551615"}]},"receipt":"a.b.c"}`))
	f.Add([]byte(`{"operation_id":"wf-1","history_head":"x","history":[{"time":"2026-12-02T06:18:49Z","attempt":4294967296}]}`))
	f.Add([]byte(`[]`))
	key, _ := receipt.NewKey("k")
	signer, _ := receipt.NewSigner("fuzz", []*receipt.Key{key})
	f.Fuzz(func(t *testing.T, raw []byte) {
		doc, err := parseHistoryDoc(raw)
		if err != nil {
			return
		}
		if doc.id == "" || doc.head == "" {
			t.Fatalf("read %q without an id or a head", raw)
		}
		var jwss []string
		if doc.receipt != "" {
			jwss = append(jwss, doc.receipt)
		}
		checkHistory(doc, jwss, signer.JWKS(), io.Discard, io.Discard)
	})
}
