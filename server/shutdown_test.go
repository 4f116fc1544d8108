package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

// TestShutdownWaitsForHandlers: when running calls outlast the shutdown
// timeout, Shutdown cancels them and returns only once their handlers have
// returned, so that ledgerd closes its Redis client under no handler.
func TestShutdownWaitsForHandlers(t *testing.T) {
	l, err := ledger.New(redistest.Shared(t).Client(t), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	var returned atomic.Bool
	// A handler that goes on working for a while after its call is
	// cancelled, as one waiting for Redis's reply does.
	slow := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod != ledgerv1.LedgerService_Lookup_FullMethodName {
			return h(ctx, req)
		}
		close(entered)
		<-ctx.Done()
		time.Sleep(200 * time.Millisecond)
		returned.Store(true)
		return nil, ctx.Err()
	}
	svc := server.New(server.Config{Ledger: l, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))},
		grpc.ChainUnaryInterceptor(slow))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	called := make(chan error, 1)
	go func() {
		_, err := ledgerv1.NewLedgerServiceClient(conn).Lookup(context.Background(), &ledgerv1.LookupRequest{OperationId: "op"})
		called <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	svc.Shutdown(ctx)
	if !returned.Load() {
		t.Fatal("Shutdown returned while a handler was still running")
	}
	// The caller learns that its call got no answer, and may repeat it.
	if err := <-called; status.Code(err) != codes.Unavailable {
		t.Fatalf("the cut call returned %v, want UNAVAILABLE", err)
	}
}
