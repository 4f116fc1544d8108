package client_test

import (
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
)

// TestDoBacksOffWhenTheTenantIsOverItsRate (contract.md §5: RESOURCE_EXHAUSTED,
// "back off"): against a ledger that lets the tenant make one call at once,
// Do's Complete and the next Do's Reserve are refused RATE_LIMITED with
// RetryInfo; Do waits and repeats the same call instead of failing, so the
// outcome is recorded, the tool runs once, and the second Do replays it
// (fn does not run again).
func TestDoBacksOffWhenTheTenantIsOverItsRate(t *testing.T) {
	st := ledgertest.Start(t, redistest.Shared(t).Client(t), ledgertest.Options{Policy: testPolicy, Rate: 4, Burst: 1})
	var limited atomic.Int32
	count := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if status.Code(err) == codes.ResourceExhausted {
			limited.Add(1)
		}
		return err
	})
	c, err := client.Dial(st.Addr, fast, client.WithDialOptions(count))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	op := client.Op{ID: "rate-" + client.NewHolder()[2:10], Tool: "payments.refund", Params: map[string]any{"amount": 10}, PermitID: "permit-1"}
	fn, applied := countingTool()
	for i := range 2 {
		res, err := c.Do(context.Background(), op, fn)
		if err != nil || res.ResourceID != "re_1" {
			t.Fatalf("Do %d = %+v, %v", i+1, res, err)
		}
	}
	if n := applied.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	if limited.Load() == 0 {
		t.Fatal("no call was refused for the rate: the test did not test the backoff")
	}
}
