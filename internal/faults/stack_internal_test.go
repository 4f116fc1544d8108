package faults

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestLedgerdStartThatExits: a ledgerd that exits before it serves (here
// its policy file does not exist; on a restart, its port is not free yet)
// makes start return an error, to be retried, not wait for ever.
func TestLedgerdStartThatExits(t *testing.T) {
	t.Parallel()
	d := &ledgerd{Addr: ledgertest.FreeAddr(t), log: &ledgertest.Buffer{}}
	d.args = []string{ledgertest.LedgerdBinary(t, tmpDir), "--listen", d.Addr,
		"--policy", filepath.Join(t.TempDir(), "no-such-policy.yaml")}
	done := make(chan error, 1)
	go func() { done <- d.start() }()
	select {
	case err := <-done:
		if err == nil {
			d.kill()
			t.Fatal("ledgerd with a missing policy file served")
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("start still waits 2 minutes after starting a ledgerd that exits at once (--policy names no file):\n%s",
			d.log.String())
	}
}
