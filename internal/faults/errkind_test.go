package faults

import (
	"context"
	"fmt"
	"testing"

	"github.com/opledger/ledger/client"
)

// TestErrKind checks how the load sorts the errors of Do it retries: a
// reconciliation the ledger could not record because it was unavailable
// is an unavailable ledger (a failover's), not an operation left needing
// a human.
func TestErrKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&client.ReconcileError{Err: fmt.Errorf("recording the finding: %w", client.ErrUnavailable)}, "unavailable"},
		{&client.ReconcileError{Err: fmt.Errorf("reconciler: %w", context.DeadlineExceeded)}, "needs reconciliation"},
		{&client.ReconcileError{Escalated: true}, "needs reconciliation"},
		{fmt.Errorf("reserve: %w", client.ErrUnavailable), "unavailable"},
		{&client.ExhaustedError{Ambiguous: true}, "retries exhausted"},
		{fmt.Errorf("recording the failed attempt (destination: no answer): %w", fmt.Errorf("ledger: NOT_FOUND: %w", client.ErrNotFound)), "record lost"},
	} {
		if got := errKind(c.err); got != c.want {
			t.Errorf("errKind(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
