package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// faultProxy is an in-process toxiproxy in front of one upstream.
type faultProxy struct {
	p *toxiproxy.Proxy
}

func newFaultProxy(t testing.TB, upstream string) *faultProxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "redis", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return &faultProxy{p: p}
}

// Addr is where clients connect.
func (f *faultProxy) Addr() string { return f.p.Listen }

// toxic adds a toxic: typ (latency, reset_peer, timeout, ...) on stream
// (upstream: towards Redis; downstream: towards the client), on a share
// (toxicity) of the connections, with its attributes as JSON.
func (f *faultProxy) toxic(t testing.TB, name, typ, stream string, toxicity float64, attrs string) {
	t.Helper()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":%g,"attributes":%s}`, name, typ, stream, toxicity, attrs)
	if _, err := f.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		t.Fatalf("toxic %s: %v", name, err)
	}
}

func (f *faultProxy) clear(t testing.TB, name string) {
	t.Helper()
	if err := f.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		t.Fatalf("removing toxic %s: %v", name, err)
	}
}

// TestNetworkFaults (issue 6 (c)) puts a toxiproxy between the ledger and
// Redis (go-redis as ledgerd sets it up, autopipelining on, with a 150ms
// read timeout and 3 retries) and, while clients run operations through it, goes through the
// faults of a real network, each for a second or two:
//   - latency on the replies, a quarter of them and then all past the read
//     timeout: the script runs, its reply comes too late, go-redis sends the
//     same EVALSHA again (or cannot even connect);
//   - reset_peer, again and again, and limit_data (every connection cut in
//     the middle of a reply): the script ran, its reply is lost, it is sent
//     again on a new connection;
//   - a silent drop of the replies, and of the requests, on half the
//     connections: read timeouts, re-sends;
//   - the proxy down, then up: connections cut, then refused.
//
// Nothing may be applied twice, every operation settles, and the history of
// every ledger call the clients made is linearizable, allowing a call's
// script to have run once more before the run that answered (a re-send; no
// more operations may need that than Redis ran scripts beyond those asked).
func TestNetworkFaults(t *testing.T) {
	srv := redistest.Start(t)
	direct := srv.Client(t)
	proxy := newFaultProxy(t, srv.Addr)

	opts := redisOptions(proxy.Addr())
	opts.ReadTimeout, opts.WriteTimeout, opts.DialTimeout = 150*time.Millisecond, 150*time.Millisecond, 300*time.Millisecond
	opts.MaxRetries = 3
	rdb := redis.NewClient(opts)
	pipe := withAutopipe(t, rdb) // as ledgerd: batches meet the faults too
	st := startStack(t, rdb, policyYAML(6*time.Second), ledger.Options{})
	if err := st.Ledger.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}

	rec := newRecorder(effIrreversible, maxAttempts)
	dest := newDestination(true, 3)
	clients := newClients(t, 3, st.Addr, rec, dest)
	ran := func() int64 { return scriptRuns(t, direct) }
	l := newLoad(dest, clients, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	finish := l.background(ctx, t, "net")

	// The fault schedule, run once (LEDGER_TEST_FAULTS=long: 5 times)
	// while the load goes on.
	type fault struct {
		name string
		on   func()
		off  func()
		dur  time.Duration
	}
	// flap adds a toxic and removes it soon after, every 250ms: each time,
	// the connections it lands on are hit at their next reply.
	flap := func(name, typ, stream string, toxicity float64, attrs string, d time.Duration) func() {
		return func() {
			for end := time.Now().Add(d); time.Now().Before(end); {
				proxy.toxic(t, name, typ, stream, toxicity, attrs)
				sleepCtx(ctx, 100*time.Millisecond)
				proxy.clear(t, name)
				sleepCtx(ctx, 150*time.Millisecond)
			}
		}
	}
	nothing := func() {}
	faults := []fault{
		{"latency 120±60ms on replies: a quarter past the 150ms read timeout",
			func() { proxy.toxic(t, "lat", "latency", "downstream", 1, `{"latency":120,"jitter":60}`) },
			func() { proxy.clear(t, "lat") }, 2 * time.Second},
		{"latency 400ms on replies: every one past the read timeout",
			func() { proxy.toxic(t, "lat", "latency", "downstream", 1, `{"latency":400}`) },
			func() { proxy.clear(t, "lat") }, time.Second},
		{"reset_peer: half the connections reset at their next reply, again and again",
			flap("rst", "reset_peer", "downstream", 0.5, `{"timeout":0}`, 1500*time.Millisecond), nothing, 0},
		{"limit_data: every connection cut in the middle of a reply after 3000 bytes",
			func() { proxy.toxic(t, "cut", "limit_data", "downstream", 1, `{"bytes":3000}`) },
			func() { proxy.clear(t, "cut") }, 1500 * time.Millisecond},
		{"silent drop of the replies on half the connections",
			func() { proxy.toxic(t, "drop", "timeout", "downstream", 0.5, `{"timeout":0}`) },
			func() { proxy.clear(t, "drop") }, 1500 * time.Millisecond},
		{"silent drop of the requests on half the connections",
			func() { proxy.toxic(t, "drop-up", "timeout", "upstream", 0.5, `{"timeout":0}`) },
			func() { proxy.clear(t, "drop-up") }, 1500 * time.Millisecond},
		{"proxy down, then up",
			func() { proxy.p.Stop() },
			func() {
				if err := proxy.p.Start(); err != nil {
					t.Errorf("proxy up: %v", err)
				}
			}, time.Second},
	}
	for range scale(1, 5) {
		for _, f := range faults {
			sleepCtx(ctx, 500*time.Millisecond)
			before := l.done.Load()
			ranBefore := ran()
			askedBefore, failedBefore := st.scripts.Load(), st.failed.Load()
			f.on()
			sleepCtx(ctx, f.dur)
			f.off()
			t.Logf("fault: %s: %d operations settled meanwhile; the ledger asked for %d scripts (%d failed), Redis ran %d",
				f.name, l.done.Load()-before, st.scripts.Load()-askedBefore, st.failed.Load()-failedBefore, ran()-ranBefore)
		}
	}
	sleepCtx(ctx, 500*time.Millisecond)
	opIDs := finish()

	v := l.verify(context.Background(), t, clients[0], opIDs)
	calls, unknown := rec.counts()
	t.Logf("%d operations: %s; %s", len(opIDs), v, dest)
	t.Logf("ledger calls by the clients: %v, %d with an unknown outcome; Do errors retried: %s", calls, unknown, l.errors())
	resent := ran() - (st.scripts.Load() - st.failed.Load())
	batches, batched := pipe.Stats()
	t.Logf("scripts: the ledger asked for %d (%d failed), the autopipelining hook sent %d in %d batches; Redis ran %d: at least %d re-sent by go-redis and run again",
		st.scripts.Load(), st.failed.Load(), batched, batches, ran(), resent)
	if twice := rec.linearizable(t, true); int64(twice) > resent {
		t.Errorf("%d operations are linearizable only if a script ran twice, but Redis ran only %d scripts more than the ledger asked for", twice, resent)
	}
}
