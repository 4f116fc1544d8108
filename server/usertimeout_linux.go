package server

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// setTCPUserTimeout bounds how long data sent on conn may stay
// unacknowledged before the kernel drops the connection (TCP_USER_TIMEOUT),
// as grpc-go does with the keepalive timeout. It does nothing when conn is
// not TCP or the option cannot be set (grpc-go ignores that too).
func setTCPUserTimeout(conn net.Conn, d time.Duration) {
	tc, ok := conn.(*net.TCPConn)
	if !ok || d <= 0 {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d/time.Millisecond))
	})
}
