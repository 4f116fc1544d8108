//go:build !linux

package server

import (
	"net"
	"time"
)

// setTCPUserTimeout does nothing: TCP_USER_TIMEOUT is Linux's (grpc-go sets
// it on Linux only too).
func setTCPUserTimeout(net.Conn, time.Duration) {}
