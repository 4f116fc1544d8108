package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/autopipe"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
)

// countingProxy forwards a client's connections to Redis and records the
// name of every command the client sends (parsed from the RESP stream), so
// a test can count what one RPC costs without MONITOR or CLIENT commands.
type countingProxy struct {
	ln   net.Listener
	to   string
	mu   sync.Mutex
	cmds []string
}

func newCountingProxy(t *testing.T, to string) *countingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln, to: to}
	go p.serve()
	t.Cleanup(func() { _ = ln.Close() })
	return p
}

func (p *countingProxy) serve() {
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
		go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		go func() {
			defer s.Close()
			r := bufio.NewReader(c)
			for {
				name, raw, err := readCommand(r)
				if err != nil {
					return
				}
				// Recorded before it is forwarded: once Redis has it, the
				// reply may end the RPC, and the test then counts.
				p.mu.Lock()
				p.cmds = append(p.cmds, name)
				p.mu.Unlock()
				if _, err := s.Write(raw); err != nil {
					return
				}
			}
		}()
	}
}

// readCommand reads one RESP command (an array of bulk strings) and returns
// its name, lower-cased, and the command's bytes as read.
func readCommand(r *bufio.Reader) (name string, raw []byte, err error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return "", nil, fmt.Errorf("not a command: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		return "", nil, err
	}
	raw = append(raw, line...)
	for i := range n {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil {
			return "", nil, err
		}
		raw = append(raw, line...)
		start := len(raw)
		raw = append(raw, make([]byte, size+2)...)
		if _, err := io.ReadFull(r, raw[start:]); err != nil {
			return "", nil, err
		}
		if i == 0 {
			name = strings.ToLower(string(raw[start : start+size]))
		}
	}
	return name, raw, nil
}

// since returns the commands sent after the first n.
func (p *countingProxy) since(n int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.cmds[n:]...)
}

func (p *countingProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.cmds)
}

// commandCalls returns INFO commandstats as command -> calls (commands run
// inside scripts included).
func commandCalls(t *testing.T, rdb *redis.Client) map[string]int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		out[name] = n
	}
	return out
}

// warmService starts a service on rdb with o, its scripts loaded and its
// sweeper asleep (a sweep once an hour: nothing else talks to Redis
// meanwhile), and returns a client of it.
func warmService(t *testing.T, rdb redis.UniversalClient, o servicetest.Options) ledgerv1.LedgerServiceClient {
	t.Helper()
	o.SweepInterval = time.Hour
	stack := servicetest.Start(t, rdb, o)
	if err := stack.Ledger.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(stack.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return ledgerv1.NewLedgerServiceClient(conn)
}

// TestOneRoundTripPerRPC runs each ledger RPC through the whole service on a
// warm script cache and checks it sends Redis exactly one command (an
// FCALL, or an EVALSHA with Functions off), counted on the wire by a proxy
// and by Redis's own commandstats, with the plain client and with
// autopipelining.
func TestOneRoundTripPerRPC(t *testing.T) {
	for _, tc := range []struct {
		name         string
		autopipeline bool
		noFunctions  bool
		want         string // the one command
	}{
		{"plain", false, false, "fcall"},
		{"autopipeline", true, false, "fcall"},
		{"evalsha", false, true, "evalsha"},
		{"evalsha autopipeline", true, true, "evalsha"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			direct := srv.Client(t)
			proxy := newCountingProxy(t, srv.Addr)
			rdb := redis.NewClient(&redis.Options{Addr: proxy.ln.Addr().String(), DisableIdentity: true, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			if tc.autopipeline {
				h := autopipe.Enable(rdb, autopipe.Options{})
				t.Cleanup(h.Close)
			}
			c := warmService(t, rdb, servicetest.Options{NoFunctions: tc.noFunctions})
			ctx := context.Background()

			var token uint64
			reserve := func() error {
				res, err := c.Reserve(ctx, &ledgerv1.ReserveRequest{OperationId: "wf-1:refund", Tool: "payments.refund", PermitId: "p", Holder: "h"})
				if err == nil {
					token = res.GetOperation().GetFencingToken()
				}
				return err
			}
			rpcs := []struct {
				name string
				call func() error
			}{
				{"Reserve (new)", reserve},
				{"Renew", func() error {
					_, err := c.Renew(ctx, &ledgerv1.RenewRequest{OperationId: "wf-1:refund", FencingToken: token})
					return err
				}},
				{"MarkUnknown", func() error {
					_, err := c.MarkUnknown(ctx, &ledgerv1.MarkUnknownRequest{OperationId: "wf-1:refund", FencingToken: token})
					return err
				}},
				{"Reconcile", func() error {
					res, err := c.Reconcile(ctx, &ledgerv1.ReconcileRequest{OperationId: "wf-1:refund", Finding: ledgerv1.Finding_FINDING_NOT_APPLIED})
					if err == nil && len(res.GetOperation().GetHistory()) != 3 {
						err = fmt.Errorf("history has %d entries, want 3", len(res.GetOperation().GetHistory()))
					}
					return err
				}},
				{"Reserve (claim)", reserve},
				{"Complete", func() error {
					_, err := c.Complete(ctx, &ledgerv1.CompleteRequest{OperationId: "wf-1:refund", FencingToken: token, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED})
					return err
				}},
				{"Lookup", func() error {
					res, err := c.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: "wf-1:refund"})
					if err == nil && len(res.GetOperation().GetHistory()) != 5 {
						err = fmt.Errorf("history has %d entries, want 5", len(res.GetOperation().GetHistory()))
					}
					return err
				}},
				{"Reserve (replay)", reserve},
			}
			for _, rpc := range rpcs {
				before, stats := proxy.count(), commandCalls(t, direct)
				if err := rpc.call(); err != nil {
					t.Fatalf("%s: %v", rpc.name, err)
				}
				after := commandCalls(t, direct)
				if sent := proxy.since(before); len(sent) != 1 || sent[0] != tc.want {
					t.Errorf("%s sent %v to Redis, want exactly one %s", rpc.name, sent, tc.want)
				}
				for _, cmd := range []string{"fcall", "evalsha", "eval"} {
					want := 0
					if cmd == tc.want {
						want = 1
					}
					if d := after[cmd] - stats[cmd]; d != want {
						t.Errorf("%s: Redis ran %d %s, want %d", rpc.name, d, cmd, want)
					}
				}
			}
		})
	}
}

// TestRunRoundTrips counts what a Reserve with a run id sends Redis, through
// two services on one Redis (two ledgerd instances) with autopipelining: a
// run id no run governs costs one EXISTS and no script; a step of a run the
// instance knows exists costs the run guard's script and the Reserve's; an
// instance asks once, with EXISTS, about a run another one started; a run
// gone since is asked about again; under an implicit run policy nothing is
// asked. Each step's run (or none) is checked on the operation.
func TestRunRoundTrips(t *testing.T) {
	srv := redistest.Start(t)
	direct := srv.Client(t)
	proxy := newCountingProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.ln.Addr().String(), DisableIdentity: true, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	h := autopipe.Enable(rdb, autopipe.Options{})
	t.Cleanup(h.Close)
	ctx := context.Background()
	a, b := warmService(t, rdb, servicetest.Options{}), warmService(t, rdb, servicetest.Options{})
	implicit := warmService(t, rdb, servicetest.Options{Prefix: "implicit", Policy: runsPolicy})
	step := func(c ledgerv1.LedgerServiceClient, op, run string) func() error {
		return func() error {
			res, err := c.Reserve(ctx, &ledgerv1.ReserveRequest{OperationId: op, Tool: "payments.refund", PermitId: "p", Holder: "h", RunId: run})
			if err == nil && res.GetOperation().GetRunId() != run {
				err = fmt.Errorf("recorded in run %q", res.GetOperation().GetRunId())
			}
			return err
		}
	}
	steps := func(c ledgerv1.LedgerServiceClient, run string, want uint32) func() error {
		return func() error {
			res, err := c.GetRun(ctx, &ledgerv1.GetRunRequest{RunId: run})
			if err == nil && res.GetRun().GetSteps() != want {
				err = fmt.Errorf("run %s counted %d steps, want %d", run, res.GetRun().GetSteps(), want)
			}
			return err
		}
	}
	for _, c := range []struct {
		name  string
		call  func() error
		want  []string // the commands sent, in order
		check func() error
	}{
		{"Reserve, a run id no run governs", step(a, "free-1", "free"), []string{"exists", "fcall"}, nil},
		{"StartRun", func() error {
			_, err := a.StartRun(ctx, &ledgerv1.StartRunRequest{RunId: "r"})
			return err
		}, []string{"fcall"}, nil},
		{"Reserve, a step of a run this instance started", step(a, "r-1", "r"), []string{"fcall", "fcall"}, steps(a, "r", 1)},
		{"Reserve, a step of a run another instance started", step(b, "r-2", "r"), []string{"exists", "fcall", "fcall"}, steps(b, "r", 2)},
		{"Reserve, its next step there", step(b, "r-3", "r"), []string{"fcall", "fcall"}, steps(b, "r", 3)},
		{"Reserve, a step of a run gone since", func() error {
			keys, err := direct.Keys(ctx, "ledger:*:run:*").Result()
			if err == nil && len(keys) != 1 {
				err = fmt.Errorf("run keys %v, want one", keys)
			}
			if err == nil {
				err = direct.Del(ctx, keys...).Err()
			}
			if err != nil {
				return err
			}
			return step(b, "r-4", "r")()
		}, []string{"fcall", "fcall"}, nil},
		{"Reserve, the next step of the run gone", step(b, "r-5", "r"), []string{"exists", "fcall"}, nil},
		{"Reserve under an implicit run policy", step(implicit, "i-1", "i"), []string{"fcall", "fcall"}, steps(implicit, "i", 1)},
	} {
		before := proxy.count()
		if err := c.call(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if sent := proxy.since(before); strings.Join(sent, " ") != strings.Join(c.want, " ") {
			t.Errorf("%s sent %v to Redis, want %v", c.name, sent, c.want)
		}
		if c.check != nil {
			if err := c.check(); err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		}
	}
}
