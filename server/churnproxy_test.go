package server_test

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// churnProxy forwards TCP connections to a redis-server and lets a test
// disturb them: stall holds every reply (the requests still reach Redis)
// until unstall, and reset cuts every connection at once with a TCP reset.
// It counts the goroutines and sockets it holds, so that a test measuring
// the process can tell them from the ledger's.
type churnProxy struct {
	ln       net.Listener
	upstream string

	goroutines atomic.Int64 // copiers running
	sockets    atomic.Int64 // sockets open

	mu     sync.Mutex
	gate   chan struct{} // closed while replies flow; nil: they flow
	pairs  map[*proxyPair]struct{}
	closed bool
}

// A proxyPair is one proxied connection: the client's and Redis's sides.
type proxyPair struct {
	down, up net.Conn
	once     sync.Once
	done     chan struct{} // closed when either side ends
}

func (pp *proxyPair) end() { pp.once.Do(func() { close(pp.done) }) }

// newChurnProxy starts a proxy to upstream on a free loopback port, and stops
// it (cutting every connection) at the test's end.
func newChurnProxy(t testing.TB, upstream string) *churnProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &churnProxy{ln: ln, upstream: upstream, pairs: map[*proxyPair]struct{}{}}
	p.goroutines.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Addr is the address clients dial.
func (p *churnProxy) Addr() string { return p.ln.Addr().String() }

// Conns is how many proxied connections are open.
func (p *churnProxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pairs)
}

// stall holds every reply, on open and new connections, until unstall.
func (p *churnProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate == nil {
		p.gate = make(chan struct{})
	}
}

// unstall lets the held replies through.
func (p *churnProxy) unstall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

// reset cuts every open connection with a TCP reset.
func (p *churnProxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pp := range p.pairs {
		if tc, ok := pp.down.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = pp.down.Close()
		_ = pp.up.Close()
		pp.end()
	}
}

func (p *churnProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.unstall()
	p.reset()
}

func (p *churnProxy) serve() {
	defer p.goroutines.Add(-1)
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.sockets.Add(1)
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = down.Close()
			p.sockets.Add(-1)
			continue
		}
		p.sockets.Add(1)
		pp := &proxyPair{down: down, up: up, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_, _ = down.Close(), up.Close()
			p.sockets.Add(-2)
			return
		}
		p.pairs[pp] = struct{}{}
		p.mu.Unlock()
		var copiers sync.WaitGroup
		copiers.Add(2)
		p.goroutines.Add(3)
		go func() {
			defer p.goroutines.Add(-1)
			defer copiers.Done()
			// Through plain readers and writers: io.Copy between two TCP
			// connections would splice through pipes that the runtime
			// caches, file descriptors the test would count.
			_, _ = io.Copy(struct{ io.Writer }{up}, struct{ io.Reader }{down})
			pp.end()
		}()
		go func() {
			defer p.goroutines.Add(-1)
			defer copiers.Done()
			p.replies(pp)
			pp.end()
		}()
		go func() {
			// Whichever side ends first ends the pair: a client that closes
			// its connection (a read timeout) drops Redis's side too.
			defer p.goroutines.Add(-1)
			<-pp.done
			_, _ = down.Close(), up.Close()
			copiers.Wait()
			p.mu.Lock()
			delete(p.pairs, pp)
			p.mu.Unlock()
			p.sockets.Add(-2)
		}()
	}
}

// replies copies Redis's replies to the client, waiting while the proxy
// stalls.
func (p *churnProxy) replies(pp *proxyPair) {
	buf := make([]byte, 32<<10)
	for {
		n, err := pp.up.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			if gate != nil {
				select {
				case <-gate:
				case <-pp.done:
					return
				}
			}
			if _, werr := pp.down.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
