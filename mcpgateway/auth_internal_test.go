package mcpgateway

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
)

// TestVerify: a key the ledger takes is verified, with its tenant; keys it
// refuses are ErrInvalidToken and leave no client behind, so that requests
// with made-up keys cannot grow the gateway's memory.
func TestVerify(t *testing.T) {
	keys, creds := servicetest.Keys(t, "acme", "acme")
	st := servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{Credentials: creds})
	conn, err := grpc.NewClient(st.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	g := &Gateway{conn: conn, clients: map[string]*client.Client{}}
	v := &verifier{g: g}
	ctx := context.Background()
	for i := range 50 {
		for _, bad := range []string{fmt.Sprintf("acme-agent.made-up-%d", i), fmt.Sprintf("nobody-%d.x", i)} {
			if _, err := v.verify(ctx, bad, nil); !errors.Is(err, auth.ErrInvalidToken) {
				t.Fatalf("verify(%q) = %v, want ErrInvalidToken", bad, err)
			}
		}
	}
	if n := len(g.clients); n != 0 {
		t.Fatalf("%d clients kept for keys the ledger refused", n)
	}
	info, err := v.verify(ctx, keys["agent"], nil)
	if err != nil || info.UserID != "acme-agent" || info.Extra["tenant"] != "acme" {
		t.Fatalf("verify(a valid key) = %+v, %v", info, err)
	}
}
