package ledgertest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// NonLoopbackIPv4 returns an IPv4 address of this machine that is not
// loopback, for tests of what may or may not go beyond it; it skips the
// test on a machine without one.
func NonLoopbackIPv4(t testing.TB) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skip(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address")
	return ""
}

// ClosedAddr returns a loopback address nothing listens on: one a listener
// bound and closed.
func ClosedAddr(tb testing.TB) string {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	return addr
}

// ListenAddr waits until log holds a JSON line whose "msg" is msg (ledgerd
// writes "ledgerd serving" and "metrics serving") and returns its "listen"
// field: the address a listener given port 0 bound. Tests start ledgerd on
// 127.0.0.1:0 and read the address back, so no other process can take the
// port between choosing it and binding it. It gives up when exited is
// closed (nil: never) or after timeout.
func ListenAddr(log func() string, msg string, exited <-chan struct{}, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		for _, line := range strings.Split(log(), "\n") {
			if !strings.HasPrefix(line, "{") {
				continue
			}
			var l struct{ Msg, Listen string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg && l.Listen != "" {
				return l.Listen, nil
			}
		}
		select {
		case <-exited:
			return "", fmt.Errorf("exited before logging %q", msg)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %q line within %s", msg, timeout)
		}
	}
}

// Await polls cond every 10 ms until it holds, and fails tb with "never:
// what" when it does not within 10 s.
func Await(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("never: %s", what)
		}
	}
}

// IdleClosed sends one GET of path to addr over a new connection, reads
// the answer, and returns nil once the server closes the connection left
// idle; an error when it is still open after 10 s, or the GET failed.
func IdleClosed(addr, path string) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("the idle connection after GET %s (%s) was not closed: %v", path, resp.Status, err)
	}
	return nil
}
