package ledger

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redistest"
)

// lossyProxy forwards Redis traffic and, when armed, lets the next EVALSHA
// reach Redis but cuts the connection instead of returning its reply: the
// client sees a lost response and go-redis sends the script again, exactly
// as after a read timeout.
type lossyProxy struct {
	ln    net.Listener
	to    string
	armed atomic.Bool
	cuts  atomic.Int32
	wg    sync.WaitGroup
}

func newLossyProxy(t *testing.T, to string) *lossyProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{ln: ln, to: to}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { _ = ln.Close(); p.wg.Wait() })
	return p
}

func (p *lossyProxy) addr() string { return p.ln.Addr().String() }

func (p *lossyProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		var evalsha atomic.Bool
		go func() { // client -> server
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if bytes.Contains(bytes.ToUpper(buf[:n]), []byte("EVALSHA")) && p.armed.Load() {
						evalsha.Store(true)
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = s.Close()
					return
				}
			}
		}()
		go func() { // server -> client
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if evalsha.Load() && p.armed.CompareAndSwap(true, false) {
						// The script ran; its reply is lost.
						p.cuts.Add(1)
						_ = c.Close()
						_ = s.Close()
						return
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = c.Close()
					return
				}
			}
		}()
	}
}

func evalshaCalls(t *testing.T, c *redis.Client) int {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// TestScriptsSafeWhenResent cuts the reply of every kind of write script, so
// go-redis sends it a second time, and checks the outcome equals one run: no
// second attempt, no second history entry.
func TestScriptsSafeWhenResent(t *testing.T) {
	srv := redistest.Start(t)
	direct := srv.Client(t)
	proxy := newLossyProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.addr(), DisableIdentity: true, MaxRetries: 3})
	t.Cleanup(func() { _ = rdb.Close() })
	pol, _ := ParsePolicies([]byte(testPolicy))
	e := newEnv(t, rdb, pol)
	if err := e.l.LoadScripts(e.ctx); err != nil { // so every call is one EVALSHA
		t.Fatal(err)
	}

	// resent runs call with the reply of its script cut once.
	resent := func(name string, call func() error) {
		t.Helper()
		before := evalshaCalls(t, direct)
		proxy.armed.Store(true)
		if err := call(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if proxy.armed.Load() {
			t.Fatalf("%s: no reply was cut", name)
		}
		if runs := evalshaCalls(t, direct) - before; runs < 2 {
			t.Fatalf("%s: the script ran %d times, want 2 (sent again)", name, runs)
		}
	}
	params := map[string]any{"amount": 10.0}
	req := ReserveRequest{OperationID: "op", Tool: "payments.refund", Params: params, PermitID: "p", Holder: "h1"}

	var first *ReserveResult
	resent("Reserve (create)", func() (err error) { first, err = e.l.Reserve(e.ctx, e.who, req); return })
	if first.Decision != DecisionExecute || first.Operation.Attempt != 1 {
		t.Fatalf("Reserve = %v %+v", first.Decision, first.Operation)
	}
	resent("Complete (retryable)", func() error {
		_, err := e.complete(t, "op", first.Operation.FencingToken, OutcomeFailedRetryable, nil, nil)
		return err
	})
	var second *ReserveResult
	resent("Reserve (claim)", func() (err error) { second, err = e.l.Reserve(e.ctx, e.who, req); return })
	if second.Decision != DecisionExecute || second.Operation.Attempt != 2 {
		t.Fatalf("claim = %v %+v", second.Decision, second.Operation)
	}
	resent("Renew", func() error {
		_, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "op", FencingToken: second.Operation.FencingToken})
		return err
	})
	resent("MarkUnknown", func() error { _, err := e.markUnknown(t, "op", second.Operation.FencingToken); return err })
	resent("Reconcile (escalate)", func() error { _, err := e.reconcile(t, "op", FindingEscalate, nil); return err })
	resent("Reconcile (not applied)", func() error { _, err := e.reconcile(t, "op", FindingNotApplied, nil); return err })
	var third *ReserveResult
	resent("Reserve (claim again)", func() (err error) { third, err = e.l.Reserve(e.ctx, e.who, req); return })
	resent("Complete (succeeded)", func() error {
		_, err := e.complete(t, "op", third.Operation.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil)
		return err
	})

	got := e.lookup(t, "op")
	want := []string{"RESERVED", "FAILED_RETRYABLE", "CLAIMED", "MARKED_UNKNOWN", "ESCALATED", "RECONCILED_NOT_APPLIED", "CLAIMED", "SUCCEEDED"}
	if strings.Join(reasons(got), ",") != strings.Join(want, ",") || got.Attempt != 3 {
		t.Fatalf("attempt %d, history %v; want attempt 3, history %v", got.Attempt, reasons(got), want)
	}
	if proxy.cuts.Load() != 9 {
		t.Fatalf("%d replies cut, want 9", proxy.cuts.Load())
	}
}
