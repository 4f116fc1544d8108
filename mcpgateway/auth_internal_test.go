package mcpgateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"testing"
	"time"

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

// TestBodyDeadline: a POST whose body does not come is cut off at
// bodyReadTimeout instead of holding its connection. (The whole suite
// passes with a bodyReadTimeout of 50ms: the deadline ends with the body,
// and cuts no answer's event stream.)
func TestBodyDeadline(t *testing.T) {
	defer func(d time.Duration) { bodyReadTimeout = d }(bodyReadTimeout)
	bodyReadTimeout = 300 * time.Millisecond
	cfg, err := ParseConfig([]byte("http: {anonymous: true}\nupstreams:\n  - {name: tickets, url: \"http://127.0.0.1:1/mcp\"}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.conn.Close() })
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// 100 bytes announced, 10 sent.
	req := "POST /mcp HTTP/1.1\r\nHost: " + srv.Listener.Addr().String() + "\r\nContent-Type: application/json\r\n" +
		"Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\""
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("the connection of a body that did not come was still open: %v", err)
	}
}
