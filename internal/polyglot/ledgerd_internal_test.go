package polyglot

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestLaunchLedgerdThatExits: a ledgerd that exits before it serves (here
// its policy file does not exist; in a full run, another process took its
// port) makes launchLedgerd return an error with ledgerd's log, not wait
// for ever.
func TestLaunchLedgerdThatExits(t *testing.T) {
	t.Parallel()
	bin := ledgertest.LedgerdBinary(t, tmpDir)
	missing := filepath.Join(t.TempDir(), "no-such-policy.yaml")
	type result struct {
		d   *ledgerdProcess
		err error
	}
	addr := ledgertest.FreeAddr(t)
	done := make(chan result, 1)
	go func() {
		d, err := launchLedgerd(bin, addr, "--policy", missing)
		done <- result{d, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			_ = r.d.stop()
			t.Fatalf("launchLedgerd with --policy %s served", missing)
		}
		if !strings.Contains(r.err.Error(), "exited") || !strings.Contains(r.err.Error(), "no-such-policy.yaml") {
			t.Fatalf("launchLedgerd's error does not say ledgerd exited, with its log: %v", r.err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("launchLedgerd still waits 2 minutes after starting a ledgerd that exits at once (--policy names no file)")
	}
}
