package bench

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
)

// TestBareServer checks the bare server the benchmark compares the ledger
// with: each health Check is SERVING and costs Redis exactly one script
// call, with and without auto-pipelining.
func TestBareServer(t *testing.T) {
	for _, plain := range []bool{false, true} {
		srv := redistest.Start(t)
		addr := ledgertest.FreeAddr(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ServeBare(ctx, addr, srv.Addr, plain) }()
		t.Cleanup(func() { cancel(); <-done })
		if err := ledgertest.WaitServing(addr, done, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		before := commandCalls(t, srv.Client(t))
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		const n = 20
		for range n {
			r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
			if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("plain=%v: Check = %v, %v", plain, r, err)
			}
		}
		after := commandCalls(t, srv.Client(t))
		if got := after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"]; got != n {
			t.Fatalf("plain=%v: %d scripts for %d checks, want one each", plain, got, n)
		}
	}
}
