package server

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ConnectionStats counts a Service's client connections.
type ConnectionStats struct {
	// Open is the connections open now, from their accept (before their
	// handshakes) to their close.
	Open int
	// Refused is the connections refused since the start for being over
	// ConnectionLimits.MaxConnections.
	Refused uint64
}

// refusalLogEvery is the least time between two log lines about refused
// connections, health watches, or calls refused for their credentials: a
// client that reconnects, watches or calls in a loop must not flood the
// log. Each line counts the refusals since the previous one.
const refusalLogEvery = 10 * time.Second

// logEvery lets through at most one log line per interval about events
// that may come in a flood, and counts the events between the lines.
type logEvery struct {
	every time.Duration
	now   func() time.Time // time.Now

	unlogged atomic.Uint64
	last     atomic.Int64 // Unix nanoseconds of the last line
}

// note counts an event and reports whether a line is due for it (none in
// the last interval); n is then the events since the previous line, this
// one included.
func (l *logEvery) note() (n uint64, due bool) {
	l.unlogged.Add(1)
	now := l.now().UnixNano()
	last := l.last.Load()
	if last != 0 && now-last < int64(l.every) || !l.last.CompareAndSwap(last, now) {
		return 0, false
	}
	return l.unlogged.Swap(0), true
}

// connCounter counts the connections of a Service, and refuses those over
// its limit.
type connCounter struct {
	max         int64 // no bound when 0
	userTimeout time.Duration
	log         *slog.Logger
	lines       logEvery // of the refusals

	open    atomic.Int64
	refused atomic.Uint64
}

// stats returns the counts.
func (c *connCounter) stats() ConnectionStats {
	return ConnectionStats{Open: int(c.open.Load()), Refused: c.refused.Load()}
}

// admit counts a new connection and reports whether it is within the limit;
// one that is not is not counted.
func (c *connCounter) admit() bool {
	if n := c.open.Add(1); c.max > 0 && n > c.max {
		c.open.Add(-1)
		return false
	}
	return true
}

// refuse closes conn at once: its client's connection attempt fails
// (UNAVAILABLE), rather than waiting in the accept queue until its
// deadline. It counts the refusal (before the close, so that whoever sees
// the close finds it counted) and logs it, at most once every
// refusalLogEvery, without the peer's address.
func (c *connCounter) refuse(conn net.Conn) {
	c.refused.Add(1)
	_ = conn.Close()
	if n, due := c.lines.note(); due {
		c.log.Warn("connections refused: the server holds its maximum of client connections",
			"max_connections", c.max, "refused", n)
	}
}

// countingListener counts the connections it accepts until they are
// closed, and refuses those over its counter's limit.
type countingListener struct {
	net.Listener
	c *connCounter
}

// Accept returns the next connection within the limit; it closes those
// over it as they come.
func (l *countingListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !l.c.admit() {
			l.c.refuse(conn)
			continue
		}
		// grpc-go sets TCP_USER_TIMEOUT to the keepalive timeout on a
		// *net.TCPConn only: on the connection it is given, which here
		// is the countedConn around it.
		setTCPUserTimeout(conn, l.c.userTimeout)
		return &countedConn{Conn: conn, c: l.c}, nil
	}
}

// countedConn is an accepted connection, uncounted at its first Close.
type countedConn struct {
	net.Conn
	c    *connCounter
	once sync.Once
}

// Close closes the connection and uncounts it.
func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.c.open.Add(-1) })
	return err
}
