package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// TestSeveralInstances runs three ledgerd processes on one redis-server and
// kills them one at a time under load, with agents pinned to instances and
// one balancing over all three, operations performed at once through
// different instances (S1, S9), crashed agents' claims for three sweepers
// to race to expire, and receipts compacted meanwhile. Then: nothing
// applied twice, every acknowledged write kept, one LEASE_EXPIRED per
// crashed attempt, every operation settled, the live counts equal to the
// records, and the history linearizable (failure-model.md §4).
func TestSeveralInstances(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	url := "redis://" + srv.Addr
	// Receipts are kept 1 s once settled, so that the compaction passes
	// have records to cut while the instances serve and die.
	policy := policyYAML(2*time.Second) + "tools:\n  - match: " + receiptTool + "\n    retention: 1s\n    tombstone_retention: 1h\n"
	var ds []*ledgerd
	var metricsAddrs []string
	for range 3 {
		m := ledgertest.FreeAddr(t)
		metricsAddrs = append(metricsAddrs, m)
		ds = append(ds, startLedgerd(t, url, policy, "--sweep-interval", "25ms", "--compact-batch", "100", "--metrics-listen", m))
	}

	rec := newRecorder(effIrreversible, maxAttempts)
	dest := newDestination(true, 3)
	opts := []client.Option{client.WithLedgerRetries(1), client.WithCallTimeout(time.Second)}
	pinned := make([][]*client.Client, len(ds)) // by instance
	for i, d := range ds {
		pinned[i] = newClients(t, 2, d.Addr, rec, dest, opts...)
	}
	balanced := newBalancedClient(t, ds, rec, dest, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	rcpt := newReceipts(t, ds, dest)
	rcpt.settle(ctx, t, scale(30, 2))

	// Agents that crash after EXECUTE, through the first two instances.
	crashed := crashAgents(ctx, t, []*client.Client{pinned[0][0], pinned[1][0]}, dest, "crash", scale(24, 2))

	// The reconciler, on the third instance.
	reconciler := newClient(t, ds[2].Addr, rec, dest, opts...)
	stopRec := reconcileInBackground(ctx, t, reconciler, dest)

	// The load: workers take the clients in turn, instance by instance,
	// then the balanced one.
	var clients []*client.Client
	for k := range 2 {
		for i := range ds {
			clients = append(clients, pinned[i][k])
		}
	}
	clients = append(clients, balanced)
	l := newLoad(dest, clients, len(clients))
	finish := l.background(ctx, t, "si")

	// S1 across instances: every 100 ms a new operation performed by three
	// callers at once, one per instance, each until it settles.
	burstStop := make(chan struct{})
	burstDone := make(chan []string)
	go func() {
		var ids []string
		var wg sync.WaitGroup
		for i := 0; ; i++ {
			select {
			case <-burstStop:
				wg.Wait()
				burstDone <- ids
				return
			case <-time.After(100 * time.Millisecond):
			}
			id := fmt.Sprintf("s1-%03d", i)
			ids = append(ids, id)
			for _, cs := range pinned {
				wg.Go(func() { l.do(ctx, t, cs[1], id) })
			}
		}
	}()

	downs := []time.Duration{200 * time.Millisecond, 1500 * time.Millisecond, 500 * time.Millisecond}
	for i := range scale(3, 4) {
		sleepCtx(ctx, time.Second)
		d := ds[i%len(ds)]
		d.kill()
		at := l.done.Load()
		down := downs[i%len(downs)]
		sleepCtx(ctx, down)
		d.restart(t)
		t.Logf("kill %d: ledgerd %d of 3 after %d operations settled; down %v, restarted on %s", i+1, i%len(ds)+1, at, down, d.Addr)
	}

	// The reconciler resolves every crashed claim once a sweeper has made
	// it UNKNOWN: applied ones SUCCEEDED, the others PENDING.
	for id := range crashed {
		waitSettledOrPending(ctx, t, reconciler, id)
	}
	reconciled, staleFindings := stopRec()
	close(burstStop)
	bursts := <-burstDone
	opIDs := finish()

	// Nothing moves now. The live counts must equal the records: the
	// crashed claims found not applied are PENDING, everything else is
	// terminal.
	all := append(append(append([]string(nil), opIDs...), bursts...), keys(crashed)...)
	rdb := redis.NewClient(redisOptions(srv.Addr))
	t.Cleanup(func() { _ = rdb.Close() })
	checkLiveCounts(ctx, t, []*redis.Client{rdb}, reconciler, metricsAddrs, all, "while the crashed agents' operations wait")

	// The crashed agents come back through another instance than the one
	// they crashed on: a replay of the reconciled result, or one new
	// attempt.
	resolveCrashed(ctx, t, pinned[2][0], dest, crashed)

	v := l.verify(context.Background(), t, reconciler, opIDs)
	vb := l.verify(context.Background(), t, reconciler, bursts)
	expired, byLoad := checkLeaseExpiries(ctx, t, reconciler, all, crashed)
	checkLiveCounts(ctx, t, []*redis.Client{rdb}, reconciler, metricsAddrs, all, "at the end")
	if p, err := reconciler.ListUnresolved(ctx, client.ListOptions{PageSize: 1000}); err != nil {
		t.Fatal(err)
	} else if len(p.Operations) > 0 || p.NextPageToken != "" {
		t.Errorf("ListUnresolved at the end: %d operations, next page %q, want none", len(p.Operations), p.NextPageToken)
		for _, o := range p.Operations {
			t.Logf("  unresolved: %s %v (%s)", o.ID, o.State, reasons(o))
		}
	}
	compacted := rcpt.check(ctx, t, []*redis.Client{rdb})
	lost, checked := lostAcks(ctx, t, reconciler, rec.acknowledged(), func(s string) { t.Error(s) })

	calls, unknown := rec.counts()
	t.Logf("%d operations of the load: %s; %d performed by one caller per instance at once: %s; %s",
		len(opIDs), v, len(bursts), vb, dest)
	t.Logf("%d crashed claims swept to UNKNOWN (one LEASE_EXPIRED each), %d claims of the load abandoned and expired; %d findings of the reconciler on instance 3 accepted, %d refused STALE_FENCING_TOKEN",
		expired, byLoad, reconciled, staleFindings)
	t.Logf("%d receipts settled, cut to their tombstone by the compaction passes (%d of them at the first look, after the other checks), and refused as expired when performed again", len(rcpt.ids), compacted)
	t.Logf("acknowledged writes checked %v, lost %d", checked, lost)
	t.Logf("ledger calls by the clients: %v, %d with an unknown outcome; Do errors retried: %s", calls, unknown, l.errors())
	rec.linearizable(t, false)
}

// newBalancedClient returns an SDK client that balances its calls over
// every instance (round robin over a static list of addresses, as a client
// behind DNS with several addresses does), so it fails over when one dies.
func newBalancedClient(t testing.TB, ds []*ledgerd, rec *recorder, d *destination, opts ...client.Option) *client.Client {
	t.Helper()
	r := manual.NewBuilderWithScheme("ledgers")
	var addrs []resolver.Address
	for _, d := range ds {
		addrs = append(addrs, resolver.Address{Addr: d.Addr})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	opts = append(opts, client.WithDialOptions(grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`)))
	return newClient(t, r.Scheme()+":///ledger", rec, d, opts...)
}

// reconcilerNote is the note of reconcileInBackground's findings; the
// agents' own reconciler writes the destination's (destination.reconcile).
const reconcilerNote = "listed as unknown, checked at the destination"

// reconcileInBackground runs a reconciler with c until the returned
// function is called, which returns how many of its findings were accepted
// (those that agree with a finding an agent had recorded already
// included) and how many were refused STALE_FENCING_TOKEN. Every 100 ms it lists the UNKNOWN operations and records what
// the destination says about each one's current attempt (fenced by its
// token, so a finding that arrives after another attempt took over changes
// nothing). Refusals (an agent was first with another finding, another
// attempt took over, the instance is down) are left to the next round.
func reconcileInBackground(ctx context.Context, t testing.TB, c *client.Client, d *destination) (stop func() (accepted, stale int)) {
	quit := make(chan struct{})
	done := make(chan [2]int)
	go func() {
		var n [2]int
		defer func() { done <- n }()
		for {
			select {
			case <-quit:
				return
			case <-time.After(100 * time.Millisecond):
			}
			p, err := c.ListUnresolved(ctx, client.ListOptions{PageSize: 1000, States: []client.State{client.StateUnknown}})
			if err != nil {
				continue
			}
			for _, o := range p.Operations {
				if o.NeedsReview {
					continue
				}
				f, err := d.reconcile(ctx, o)
				if err != nil {
					t.Errorf("reconciler: %v", err)
					return
				}
				// A note of its own: the same finding as an agent's, by
				// the same principal (no authentication here), is a new
				// finding, not a repeat of the agent's, so once another
				// attempt holds the operation it is refused
				// STALE_FENCING_TOKEN.
				f.Note = reconcilerNote
				f.FencingToken = o.FencingToken
				switch _, err := c.Reconcile(ctx, o.ID, f); {
				case err == nil:
					n[0]++
				case errors.Is(err, client.ErrStaleToken):
					n[1]++
				}
			}
		}
	}()
	return func() (int, int) {
		close(quit)
		n := <-done
		return n[0], n[1]
	}
}

// waitSettledOrPending polls an operation until it is terminal or PENDING.
func waitSettledOrPending(ctx context.Context, t testing.TB, c *client.Client, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		o, err := c.Lookup(ctx, id)
		if err == nil && (o.State == client.StateSucceeded || o.State == client.StateFailedFinal || o.State == client.StatePending) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reconciled within 30s: %+v, %v", id, o, err)
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// checkLeaseExpiries checks every operation's history: no attempt has more
// than one LEASE_EXPIRED entry, whichever sweeper or caller recorded it,
// and each crashed agent's claim that it left RUNNING has exactly one, for
// its attempt, by the sweeper (principal "ledger"). It returns how many
// crashed claims were expired and how many attempts of other operations.
func checkLeaseExpiries(ctx context.Context, t testing.TB, c *client.Client, ids []string, crashed map[string]string) (swept, others int) {
	t.Helper()
	for _, id := range ids {
		o, err := c.Lookup(ctx, id)
		if err != nil {
			t.Fatalf("Lookup(%s): %v", id, err)
		}
		byAttempt := map[uint32][]client.HistoryEntry{}
		for _, h := range o.History {
			if h.Reason == "LEASE_EXPIRED" {
				byAttempt[h.Attempt] = append(byAttempt[h.Attempt], h)
			}
		}
		for att, hs := range byAttempt {
			if len(hs) > 1 {
				t.Errorf("%s: attempt %d expired %d times: %s", id, att, len(hs), reasons(o))
			}
		}
		how, ok := crashed[id]
		if !ok {
			others += len(byAttempt)
			continue
		}
		hs := byAttempt[1]
		switch {
		case how == "applied, marked unknown":
			if len(hs) != 0 {
				t.Errorf("%s (%s): %d LEASE_EXPIRED entries, want none (it was UNKNOWN before its lease ended): %s", id, how, len(hs), reasons(o))
			}
		case len(hs) != 1 || len(byAttempt) != 1:
			t.Errorf("%s (%s): LEASE_EXPIRED entries by attempt %v, want one for attempt 1: %s", id, how, byAttempt, reasons(o))
		case hs[0].Principal != ledger.SweeperPrincipal || hs[0].From != client.StateRunning || hs[0].To != client.StateUnknown:
			t.Errorf("%s (%s): expired by %+v, want RUNNING → UNKNOWN by the sweeper (principal %q)", id, how, hs[0], ledger.SweeperPrincipal)
		default:
			swept++
		}
	}
	return swept, others
}

// receiptTool is the tool of the receipts: the policy keeps them 1 s once
// settled, then 1 h as tombstones.
const receiptTool = "faults.receipt"

// receipts are operations that settle at once and expire a second later,
// for the compaction passes of every instance to cut to their tombstones;
// performed again afterwards, through another instance, they are refused
// (S6), without running.
type receipts struct {
	clients []*client.Client // one per instance

	mu   sync.Mutex
	ids  []string
	runs map[string]int
}

func newReceipts(t testing.TB, ds []*ledgerd, d *destination) *receipts {
	addrs := make([]string, len(ds))
	for i, ld := range ds {
		addrs[i] = ld.Addr
	}
	return newReceiptsOn(t, addrs, d)
}

// newReceiptsOn returns receipts performed through a client of each of
// the ledger services at addrs.
func newReceiptsOn(t testing.TB, addrs []string, d *destination) *receipts {
	r := &receipts{runs: map[string]int{}}
	for _, addr := range addrs {
		// Their own recorder: the model knows no retention.
		r.clients = append(r.clients, newClient(t, addr, newRecorder(effIrreversible, maxAttempts), d))
	}
	return r
}

func (r *receipts) op(id string) client.Op {
	return client.Op{ID: id, Tool: receiptTool, Params: map[string]any{"receipt": id}, PermitID: "permit-1"}
}

func (r *receipts) fn(_ context.Context, a client.Attempt) (client.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[a.OperationID]++
	return client.Result{ResourceID: "rc-" + a.OperationID}, nil
}

// settle performs n receipts, each through instance i mod 3.
func (r *receipts) settle(ctx context.Context, t testing.TB, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("rcpt-%03d", i)
		r.ids = append(r.ids, id)
		if _, err := r.clients[i%len(r.clients)].Do(ctx, r.op(id), r.fn); err != nil {
			t.Fatalf("Do(%s): %v", id, err)
		}
	}
}

// performInBackground performs receipts, one after another, through the
// clients in turn, until stop is called, which returns how many. A Do
// answered UNAVAILABLE (the SDK gave up repeating it) is repeated with the
// same operation id.
func (r *receipts) performInBackground(ctx context.Context, t testing.TB, pause time.Duration) (stop func() int) {
	quit := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		defer func() { done <- n }()
		for ; ; n++ {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			default:
			}
			id := fmt.Sprintf("rcpt-%03d", n)
			r.mu.Lock()
			r.ids = append(r.ids, id)
			r.mu.Unlock()
			var err error
			for range 50 {
				if _, err = r.clients[n%len(r.clients)].Do(ctx, r.op(id), r.fn); !errors.Is(err, client.ErrUnavailable) {
					break
				}
				sleepCtx(ctx, 100*time.Millisecond)
			}
			if err != nil {
				t.Errorf("Do(%s): %v", id, err)
				n++
				return
			}
			sleepCtx(ctx, pause)
		}
	}()
	return func() int { close(quit); return <-done }
}

// check waits until every receipt's record is cut to its tombstone (the
// fingerprint and four fields, no history), each on one of nodes (one
// server, or every master of a cluster) and on one only, and returns how
// many were at the first look; then it performs each again, through
// another instance than the first time, which must be refused as expired
// without running.
func (r *receipts) check(ctx context.Context, t testing.TB, nodes []*redis.Client) (first int) {
	t.Helper()
	pattern := ledger.DefaultPrefix + ":{s[0-9][0-9]}:op:default:rcpt-*"
	deadline := time.Now().Add(30 * time.Second)
	for look := 0; ; look++ {
		records := map[string]int{} // by key: on how many nodes
		cut := 0
		for _, rdb := range nodes {
			ks, err := rdb.Keys(ctx, pattern).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range ks {
				v, err := rdb.Get(ctx, k).Result()
				if err != nil {
					t.Fatalf("GET %s: %v", k, err)
				}
				records[k]++
				// A tombstone: st, exp, ct, ut, then an empty attempt, the
				// consequential fields and the history chain's head; no
				// history.
				if f := strings.Split(v[min(len(v), 33):], "\xff"); len(f) == 7 && f[4] == "" && len(f[6]) == 40 && !strings.Contains(v[min(len(v), 33):], "\xfe") {
					cut++
				}
			}
		}
		if look == 0 {
			first = cut
		}
		for k, n := range records {
			if n > 1 {
				t.Fatalf("receipts: %s is on %d nodes", k, n)
			}
		}
		if len(records) == len(r.ids) && cut == len(records) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("receipts: %d records of %d, %d cut to their tombstone, 30 s after the first look", len(records), len(r.ids), cut)
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
	for i, id := range r.ids {
		var err error
		for range 50 {
			if _, err = r.clients[(i+1)%len(r.clients)].Do(ctx, r.op(id), r.fn); !errors.Is(err, client.ErrUnavailable) {
				break
			}
			sleepCtx(ctx, 100*time.Millisecond)
		}
		if !errors.Is(err, client.ErrKeyExpired) {
			t.Errorf("receipt %s performed again after its tombstone: %v, want %v", id, err, client.ErrKeyExpired)
		}
		r.mu.Lock()
		n := r.runs[id]
		r.mu.Unlock()
		if n != 1 {
			t.Errorf("receipt %s ran %d times", id, n)
		}
	}
	return first
}

// checkLiveCounts compares the live counts the scripts keep in every
// shard's stats hash (what the unresolved gauges read), on every node of
// nodes (one server, or every master of a cluster), with the records of
// the operations ids, which must be every operation in the store: each
// "<tool>|<state>|<tenant>" field must equal the number of records in that
// state, and no other field may be there. It also checks that the lease
// index holds no claim unless a record is RUNNING, and that the overdue
// index holds no more members of a state than records are in it. Every instance's
// unresolved gauge (ledger_unresolved_operations, on its metrics listener)
// must show the same counts within its cache period.
func checkLiveCounts(ctx context.Context, t testing.TB, nodes []*redis.Client, c *client.Client, metricsAddrs []string, ids []string, when string) {
	t.Helper()
	want := map[string]int64{}
	for _, id := range ids {
		o, err := c.Lookup(ctx, id)
		if err != nil {
			t.Fatalf("Lookup(%s): %v", id, err)
		}
		switch o.State {
		case client.StatePending, client.StateRunning, client.StateUnknown:
			want[fmt.Sprintf("%s|%d|default", o.Tool, o.State)]++
		}
	}
	got := map[string]int64{}
	var leases int64
	overdue := map[string]int64{} // by state
	for _, rdb := range nodes {
		shards, err := rdb.Keys(ctx, ledger.DefaultPrefix+":{s[0-9][0-9]}:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range shards {
			switch {
			case strings.HasSuffix(k, ":stats"):
				fields, err := rdb.HGetAll(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				for f, v := range fields {
					n, err := strconv.ParseInt(v, 10, 64)
					if err != nil {
						t.Errorf("%s: field %s is %q", k, f, v)
					}
					got[f] += n
				}
			case strings.HasSuffix(k, ":leases"):
				leases += rdb.ZCard(ctx, k).Val()
			case strings.HasSuffix(k, ":overdue"):
				for _, m := range rdb.ZRange(ctx, k, 0, -1).Val() {
					st, _, _ := strings.Cut(m, "|")
					overdue[st]++
				}
			}
		}
	}
	var fields []string
	for f := range want {
		fields = append(fields, f)
	}
	for f := range got {
		if _, ok := want[f]; !ok {
			fields = append(fields, f)
		}
	}
	sort.Strings(fields)
	var desc []string
	for _, f := range fields {
		desc = append(desc, fmt.Sprintf("%s: %d", f, want[f]))
		if got[f] != want[f] {
			t.Errorf("live counts %s: %s is %d, the records say %d", when, f, got[f], want[f])
		}
	}
	if running := want[tool+"|2|default"]; leases > running {
		t.Errorf("live counts %s: the lease indexes hold %d claims, %d records are RUNNING", when, leases, running)
	}
	for st, n := range overdue {
		if records := want[tool+"|"+st+"|default"]; n > records {
			t.Errorf("live counts %s: the overdue indexes hold %d members in state %s, %d records are", when, n, st, records)
		}
	}
	for i, addr := range metricsAddrs {
		wantGauge := map[string]float64{}
		for _, st := range []client.State{client.StatePending, client.StateRunning, client.StateUnknown} {
			if n := want[fmt.Sprintf("%s|%d|default", tool, st)]; n > 0 {
				wantGauge[strings.TrimPrefix(st.String(), "STATE_")] = float64(n)
			}
		}
		var gauge map[string]float64
		for deadline := time.Now().Add(20 * time.Second); ; {
			gauge = unresolvedGauge(t, addr, tool)
			if fmt.Sprint(gauge) == fmt.Sprint(wantGauge) || time.Now().After(deadline) {
				break
			}
			sleepCtx(ctx, 250*time.Millisecond)
		}
		if fmt.Sprint(gauge) != fmt.Sprint(wantGauge) {
			t.Errorf("live counts %s: instance %d's ledger_unresolved_operations{tool=%q} is %v, the records say %v", when, i+1, tool, gauge, wantGauge)
		}
	}
	t.Logf("live counts %s agree with the %d records, and so do the %d instances' gauges: %v", when, len(ids), len(metricsAddrs), desc)
}

// unresolvedGauge scrapes the metrics listener at addr and returns the
// tool's ledger_unresolved_operations by state, leaving out zeros.
func unresolvedGauge(t testing.TB, addr, tool string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "ledger_unresolved_operations{")
		if !ok || !strings.Contains(rest, `tool="`+tool+`"`) {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		_, st, _ := strings.Cut(labels, `state="`)
		st, _, _ = strings.Cut(st, `"`)
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			t.Fatalf("scrape %s: %q", addr, line)
		}
		if n != 0 {
			out[st] += n
		}
	}
	return out
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
