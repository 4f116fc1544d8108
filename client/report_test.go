package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
)

// ledgerFault makes every call of one ledger method fail the way a ledger
// that does not answer fails (ledgertest.Fault).
func ledgerFault(method, mode string) client.Option {
	return client.WithDialOptions(grpc.WithChainUnaryInterceptor(ledgertest.Fault(method, mode)))
}

// The ledger gives no answer while Do records an ambiguous attempt: however
// the recording fails, and also when the report timeout ends it in the
// middle of a call, Do returns ErrUnavailable (never a bare deadline that
// a caller could take for a settled failure), and fn ran once.
func TestDoLedgerSilentWhileRecordingIsUnavailable(t *testing.T) {
	for _, mode := range []string{"hung", "unavailable", "cut"} {
		t.Run(mode, func(t *testing.T) {
			// The report timeout ends before the first MarkUnknown's call
			// timeout does.
			e := newEnv(t, redistest.Shared(t).Client(t), ledgerFault("MarkUnknown", mode),
				client.WithReportTimeout(200*time.Millisecond), client.WithCallTimeout(time.Minute))
			d := newDestination("timeout-after-write")
			op := e.op("refund", "payments.refund", map[string]any{"amount": 1})
			_, err := e.c.Do(e.ctx, op, d.fn)
			if !errors.Is(err, client.ErrUnavailable) {
				t.Fatalf("Do: %v; want ErrUnavailable", err)
			}
			if n := d.count(op.ID); n != 1 || d.calls.Load() != 1 {
				t.Fatalf("fn ran %d times, applied %d", d.calls.Load(), n)
			}
		})
	}
}

// Complete gets no answer after a success: the result comes back with
// ErrCompletionNotRecorded, which also says the ledger was unavailable.
func TestDoLedgerSilentWhileCompletingIsNotRecorded(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t), ledgerFault("Complete", "hung"),
		client.WithReportTimeout(200*time.Millisecond), client.WithCallTimeout(time.Minute))
	d := newDestination()
	res, err := e.c.Do(e.ctx, e.op("refund", "payments.refund", map[string]any{"amount": 1}), d.fn)
	if !errors.Is(err, client.ErrCompletionNotRecorded) || !errors.Is(err, client.ErrUnavailable) || res.ResourceID != "R-1" {
		t.Fatalf("Do = %+v, %v; want the result with ErrCompletionNotRecorded and ErrUnavailable", res, err)
	}
}

// The ledger refuses a reconciler's finding (here, result data it cannot
// carry): the operation is still unresolved, and Do says so instead of
// returning a bare invalid argument that reads like a malformed request.
func TestDoFindingNotRecordedNeedsReconciliation(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination("timeout-after-write")
	op := e.op("refund", "payments.refund", map[string]any{"amount": 1})
	e.c.RegisterReconciler(op.Tool, func(ctx context.Context, o *client.Operation) (client.Finding, error) {
		return client.Finding{Kind: client.Applied, Result: client.Result{Data: map[string]any{"at": make(chan int)}}}, nil
	})
	_, err := e.c.Do(e.ctx, op, d.fn)
	if !errors.Is(err, client.ErrNeedsReconciliation) {
		t.Fatalf("Do: %v; want ErrNeedsReconciliation", err)
	}
	if d.calls.Load() != 1 {
		t.Fatalf("fn ran %d times", d.calls.Load())
	}
}
