package client_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// A Reserve far larger than the ledger accepts is dropped by grpc-go's
// transport with a bare RESOURCE_EXHAUSTED (no ErrorInfo). That is no rate
// limit: Do sends it once, returns ErrMessageTooLarge (neither
// ErrRateLimited nor ErrUnavailable), runs nothing, and leaves no record.
func TestDoDoesNotRetryARequestTooLargeForTheTransport(t *testing.T) {
	var reserves atomic.Int32
	count := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/Reserve") {
			reserves.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
	e := newEnv(t, redistest.Shared(t).Client(t), count)
	op := e.op("huge", "payments.refund", map[string]any{"memo": strings.Repeat("x", 5<<20)})
	var ran atomic.Int32
	_, err := e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		ran.Add(1)
		return client.Result{ResourceID: "re_1"}, nil
	})
	if !errors.Is(err, client.ErrMessageTooLarge) || errors.Is(err, client.ErrRateLimited) || errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Do = %v; want ErrMessageTooLarge only", err)
	}
	if n := reserves.Load(); n != 1 {
		t.Fatalf("the oversized Reserve was sent %d times, want 1", n)
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("fn ran %d times, want 0", n)
	}
	if _, err := e.c.Lookup(context.Background(), op.ID); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Lookup = %v, want ErrNotFound", err)
	}
}
