package client_test

import (
	"context"
	"net"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/client"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

func TestNewHolderIsUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		h := client.NewHolder()
		if seen[h] || len(h) != 34 {
			t.Fatalf("holder %q repeated or malformed", h)
		}
		seen[h] = true
	}
}

// TestDialAndReserve runs the client against a ledgerd-like stack on the
// embedded engine.
func TestDialAndReserve(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true})
	l, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(server.Config{Ledger: l})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	t.Cleanup(svc.GRPC.Stop)

	c, err := client.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	holder := client.NewHolder()
	req := &ledgerv1.ReserveRequest{OperationId: "run-1:call-1", Tool: "tickets.create", Holder: holder}
	first, err := c.Reserve(context.Background(), req)
	if err != nil || first.Decision != ledgerv1.Decision_DECISION_EXECUTE {
		t.Fatalf("Reserve = %v, %v", first, err)
	}
	again, err := c.Reserve(context.Background(), req)
	if err != nil || again.Decision != ledgerv1.Decision_DECISION_EXECUTE || again.Operation.FencingToken != first.Operation.FencingToken {
		t.Fatalf("the same holder again = %v, %v", again, err)
	}
	other, err := c.Reserve(context.Background(), &ledgerv1.ReserveRequest{OperationId: "run-1:call-1", Tool: "tickets.create", Holder: client.NewHolder()})
	if err != nil || other.Decision != ledgerv1.Decision_DECISION_IN_PROGRESS {
		t.Fatalf("another holder = %v, %v", other, err)
	}
}
