package polyglot

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// orderItem is a line of the order request, as a Go caller writes one.
type orderItem struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// goRequests are the requests of testdata/retry.py and retry.js as a Go
// caller writes them: structs, int32 and int64, a json.Number, map[string]string, an empty
// []string (a nil one is JSON null, another request).
var goRequests = map[string]map[string]any{
	"order": {"amount": 10.5, "currency": "EUR", "note": nil,
		"items": []orderItem{{SKU: "A-1", Qty: 2}, {SKU: "B-2", Qty: 1}}},
	"numbers": {"whole": int32(2), "float_whole": 2.0, "tenth": 0.1, "large": 1e21, "round": json.Number("100000000000000000000"), "zero": 0.0, "tiny": 1.5e-7,
		"negative": int64(-40)},
	"text":  {"name": "Zoë 🚀", "é": "accent key", "a": "ascii", "line": "a\nb\t\"q\""},
	"empty": {"list": []string{}, "object": map[string]string{}, "flag": false, "text": ""},
}

// TestRetriesAcrossLanguages: an operation the Go SDK ran, retried from
// the Python package and from the TypeScript package with the same request
// written in each language's own way, is replayed: the tool runs once, in
// Go. A fingerprint that differed by language would refuse the retry as
// IDEMPOTENCY_KEY_REUSED (or, for another key, run the tool again).
func TestRetriesAcrossLanguages(t *testing.T) {
	node, err := exec.LookPath("node")
	need(t, err == nil, "node is not on PATH")
	probe := exec.Command(systemPython, "-s", "-c", "import grpc, google.protobuf")
	probe.Env = cleanEnv()
	need(t, probe.Run() == nil, "%s cannot import grpc and google.protobuf (Debian: python3-grpcio, python3-protobuf)", systemPython)
	buildTypeScript(t)
	addr := startLedgerd(t, "--redis-url", "redis://"+redistest.Start(t).Addr+"/0")
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prefix := fmt.Sprintf("retry-%d:", os.Getpid())
	runs := 0
	for name, params := range goRequests {
		res, err := c.Do(context.Background(), client.Op{ID: prefix + name, Tool: "payments.refund", Params: params, PermitID: "p-1"},
			func(context.Context, client.Attempt) (client.Result, error) {
				runs++
				return client.Result{ResourceID: "go"}, nil
			})
		if err != nil || res.Replayed {
			t.Fatalf("Go %s: %+v, %v", name, res, err)
		}
	}
	if runs != len(goRequests) {
		t.Fatalf("the tool ran %d times in Go, want %d", runs, len(goRequests))
	}
	dir := filepath.Join("internal", "polyglot", "testdata")
	runClient(t, "PASS: python retries", systemPython, "-s", filepath.Join(dir, "retry.py"), addr, prefix)
	runClient(t, "PASS: typescript retries", node, filepath.Join(dir, "retry.js"), addr, prefix)
}
