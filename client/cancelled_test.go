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

// The caller gives up while its Reserve is in flight, and the ledger's
// answer is EXECUTE: Do must not run the tool on a context that has already
// ended. It returns the claim (the attempt is proven not applied: it never
// ran), so the operation is claimable again, not UNKNOWN awaiting a
// reconciler for an effect that cannot exist.
func TestDoDoesNotRunTheToolAfterTheCallerGaveUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	giveUp := client.WithDialOptions(grpc.WithChainUnaryInterceptor(func(c context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(c, method, req, reply, cc, opts...)
		if err == nil && strings.HasSuffix(method, "/Reserve") {
			cancel() // the caller's deadline passes as the answer arrives
		}
		return err
	}))
	e := newEnv(t, redistest.Shared(t).Client(t), giveUp)
	op := e.op("refund", "payments.refund", map[string]any{"amount": 10})
	var applied atomic.Int32
	_, err := e.c.Do(ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		if ctx.Err() != nil {
			return client.Result{}, ctx.Err()
		}
		applied.Add(1)
		return client.Result{ResourceID: "re_1"}, nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want context.Canceled", err)
	}
	o, lerr := e.c.Lookup(context.Background(), op.ID)
	if lerr != nil {
		t.Fatal(lerr)
	}
	if o.State != client.StatePending {
		t.Fatalf("after Do gave up: %v, history %s; want PENDING (claimable, nothing applied)", o.State, strings.Join(reasons(o), ","))
	}
	// The next call runs it, once.
	res, err := e.c.Do(context.Background(), op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		applied.Add(1)
		return client.Result{ResourceID: "re_1"}, nil
	})
	if err != nil || res.ResourceID != "re_1" || applied.Load() != 1 {
		t.Fatalf("Do again = %+v, %v; applied %d times, want 1", res, err, applied.Load())
	}
}
