package server

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The connections the service's listener hands to grpc-go are wrapped (to
// count them), so grpc-go no longer finds the *net.TCPConn on which it sets
// TCP_USER_TIMEOUT to the keepalive timeout: the listener sets it itself.
func TestCountingListenerSetsTCPUserTimeout(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	c := ConnectionLimits{KeepaliveTimeout: 7 * time.Second}.counter(slog.New(slog.NewTextHandler(io.Discard, nil)))
	lis := &countingListener{Listener: inner, c: c}
	peer, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	conn, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tc, ok := conn.(*countedConn).Conn.(*net.TCPConn)
	if !ok {
		t.Fatalf("accepted %T, want a *net.TCPConn inside", conn.(*countedConn).Conn)
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ms int
	var gerr error
	if err := raw.Control(func(fd uintptr) { ms, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if ms != 7000 {
		t.Errorf("TCP_USER_TIMEOUT %dms, want 7000ms (the keepalive timeout)", ms)
	}
}
