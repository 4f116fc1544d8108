package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestReceiptsPart runs the receipts part briefly on ledgerd binaries: both
// stacks answer every cycle, only the signing one with a receipt, and the
// report has both rows. It asserts nothing about speed.
func TestReceiptsPart(t *testing.T) {
	var out, log bytes.Buffer
	rep, err := Run(context.Background(), Config{
		Ledgerd: ledgertest.LedgerdBinary(t, binDir), Only: []string{"receipts"},
		Concurrency: 4, Warmup: 20 * time.Millisecond, Duration: 200 * time.Millisecond, Rounds: 1, Preload: 10,
		ReceiptRecords: 50, Dir: t.TempDir(), Out: &out, Log: &log,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	r := rep.Receipts
	if r == nil || r.Unsigned.Calls == 0 || r.Signed.Calls == 0 || r.ReceiptBytes == 0 ||
		r.AnswerBytes[1] <= r.AnswerBytes[0] || r.MemSigned.Records != 50 || r.MemUnsigned.Records != 50 {
		t.Fatalf("receipts part = %+v\n%s", r, out.String())
	}
	for _, want := range []string{"receipts: Reserve+Complete cycles", "off", "on", "a receipt is"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
}
