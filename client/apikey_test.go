package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestAPIKeyNotSentInClearWhereTheConnectionLeavesLoopback: whether the key
// may go in clear is decided by where the connection goes, not by the name
// dialed. A target named localhost whose connection reaches a non-loopback
// address (here through a dialer; a hosts file or resolver that maps
// localhost elsewhere is the same) does not get the key; the peer counts
// every call that arrives with one.
func TestAPIKeyNotSentInClearWhereTheConnectionLeavesLoopback(t *testing.T) {
	ip := ledgertest.NonLoopbackIPv4(t)
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Skip("cannot listen on", ip, err)
	}
	var calls, keys atomic.Int32
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		calls.Add(1)
		if md, _ := metadata.FromIncomingContext(ss.Context()); len(md.Get("authorization")) > 0 {
			keys.Add(1)
		}
		return status.Error(codes.Unimplemented, "not a ledger")
	}))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	elsewhere := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", lis.Addr().String())
	})

	const key = "acme-agent.0123456789abcdef"
	c, err := Dial("localhost:50051", WithAPIKey(key), WithDialOptions(elsewhere), WithLedgerRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Lookup(context.Background(), "op-1")
	if n := keys.Load(); n != 0 {
		t.Fatalf("the key went in clear to %s in %d call(s)", lis.Addr(), n)
	}
	if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "refusing to send the API key without TLS to "+ip) {
		t.Fatalf("Lookup = %v, want the refusal naming %s", err, ip)
	}
	if strings.Contains(err.Error(), "0123456789abcdef") {
		t.Fatalf("the refusal quotes the key: %v", err)
	}

	// Without a key the same connection is used: the peer is reached, so
	// the refusal above was the key's, not a failed dial.
	anon, err := Dial("localhost:50051", WithDialOptions(elsewhere), WithLedgerRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Lookup(context.Background(), "op-1"); calls.Load() != 1 || keys.Load() != 0 {
		t.Fatalf("Lookup without a key = %v; the peer saw %d call(s), %d with a key", err, calls.Load(), keys.Load())
	}
}

// TestAPIKeyGoesInClearOnlyToLocalPeers: the peers GetRequestMetadata
// sends the key to without TLS (a target named localhost): loopback
// addresses and Unix sockets; an address that is not loopback, or that
// names no IP address (an in-memory pipe: nothing says where it leads), is
// refused.
func TestAPIKeyGoesInClearOnlyToLocalPeers(t *testing.T) {
	pipe, other := net.Pipe()
	defer pipe.Close()
	defer other.Close()
	for _, tc := range []struct {
		addr net.Addr
		ok   bool
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 50051}, true},
		{&net.TCPAddr{IP: net.ParseIP("127.9.9.9"), Port: 50051}, true},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 50051}, true},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:127.0.0.1"), Port: 50051}, true},
		{&net.UnixAddr{Name: "/run/ledger.sock", Net: "unix"}, true},
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 50051}, false},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 50051, Zone: "eth0"}, false},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 50051}, false},
		{pipe.RemoteAddr(), false},
	} {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: tc.addr})
		md, err := apiKey("id.secret").GetRequestMetadata(ctx, "http://localhost:50051/ledger.v1.LedgerService")
		if tc.ok != (err == nil) || tc.ok && md["authorization"] != "Bearer id.secret" {
			t.Errorf("peer %s %s: %v, %v", tc.addr.Network(), tc.addr, md, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("the refusal quotes the key: %v", err)
		}
	}
}
