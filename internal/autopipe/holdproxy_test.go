package autopipe

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// holdProxy forwards TCP connections to a redis-server, and holds a
// connection's requests from the first one that carries a marker the test
// registered (with hold) until the test releases that marker: the command
// and whatever the connection sends after it reach Redis only then, so their
// replies cannot come before. The test decides when a reply may come, with
// no clock involved.
type holdProxy struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	gates map[string]*gate
	conns []net.Conn
}

// A gate is one marker's hold.
type gate struct {
	marker   []byte
	seen     chan struct{} // closed once a request carrying the marker arrived
	open     chan struct{} // closed by release
	seenOnce sync.Once
	openOnce sync.Once
}

// release lets the held requests through.
func (g *gate) release() { g.openOnce.Do(func() { close(g.open) }) }

// newHoldProxy starts a proxy to upstream on a free loopback port, and stops
// it (releasing every gate) at the test's end.
func newHoldProxy(t testing.TB, upstream string) *holdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{ln: ln, upstream: upstream, gates: map[string]*gate{}}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// newHeldHook starts a redis-server behind a holdProxy, and a client through
// the proxy with no read timeout of its own (only contexts bound its calls;
// with contextTimeout, go-redis's socket deadlines follow them too),
// autopipelined with opts, with the test scripts echo and incr loaded. All
// of it is closed at the test's end.
func newHeldHook(t testing.TB, contextTimeout bool, opts Options) (*redistest.Server, *holdProxy, *redis.Client, *Hook) {
	t.Helper()
	srv := redistest.Start(t)
	p := newHoldProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), DisableIdentity: true, ContextTimeoutEnabled: contextTimeout, ReadTimeout: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	h := Enable(rdb, opts)
	t.Cleanup(h.Close)
	for _, s := range []*redis.Script{echo, incr} {
		if err := s.Load(context.Background(), rdb).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return srv, p, rdb, h
}

// Addr is the address clients dial.
func (p *holdProxy) Addr() string { return p.ln.Addr().String() }

// hold registers marker: a request carrying it is held until the returned
// gate is released.
func (p *holdProxy) hold(marker string) *gate {
	g := &gate{marker: []byte(marker), seen: make(chan struct{}), open: make(chan struct{})}
	p.mu.Lock()
	p.gates[marker] = g
	p.mu.Unlock()
	return g
}

func (p *holdProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range p.gates {
		g.release()
	}
	for _, c := range p.conns {
		_ = c.Close()
	}
}

func (p *holdProxy) serve() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = down.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		go func() {
			_, _ = io.Copy(down, up)
			_ = down.Close()
		}()
		go func() {
			p.forward(up, down)
			_ = up.Close()
		}()
	}
}

// forward copies requests from down to up, waiting at each gate whose
// marker they carry (a marker may straddle two reads: the tail of the last
// read is searched again).
func (p *holdProxy) forward(up, down net.Conn) {
	buf := make([]byte, 32<<10)
	var tail []byte
	for {
		n, err := down.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			window := append(tail, chunk...)
			p.mu.Lock()
			var held []*gate
			for _, g := range p.gates {
				if bytes.Contains(window, g.marker) {
					held = append(held, g)
				}
			}
			p.mu.Unlock()
			for _, g := range held {
				g.seenOnce.Do(func() { close(g.seen) })
				<-g.open
			}
			if _, werr := up.Write(chunk); werr != nil {
				return
			}
			const keep = 64 // longer than any marker
			if len(window) > keep {
				window = window[len(window)-keep:]
			}
			tail = append(tail[:0], window...)
		}
		if err != nil {
			return
		}
	}
}

// waitClosed waits until ch is closed, failing the test after 10s: what
// would otherwise hang fails with what it waited for.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s after 10s", what)
	}
}

// waitErr waits for a call's result on ch, failing the test after 10s.
func waitErr(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return within 10s", what)
		return nil
	}
}
