package faults

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// TestLedgerdKill (issue 6 (b)) runs ledgerd as a process and kills it
// with SIGKILL three times while clients run operations through it,
// restarting it on the same port. Clients retry (their reports give up
// while it is down, as an agent that dies would), and a few agents crash
// for real after EXECUTE: some after applying the effect, some before, some
// after marking the attempt unknown. After the restarts the sweeper turns
// every abandoned irreversible claim into UNKNOWN (LEASE_EXPIRED), the
// crashed agents come back and reconcile, and every operation settles with
// exactly one effect (S7). The history is linearizable.
func TestLedgerdKill(t *testing.T) {
	srv := redistest.Start(t)
	lease := 2 * time.Second
	d := startLedgerd(t, "redis://"+srv.Addr, policyYAML(lease))

	rec := newRecorder(effIrreversible, maxAttempts)
	dest := newDestination(true, 2)
	// Few ledger retries: a report made while ledgerd is down is given
	// up, and the claim is left for the lease and the sweeper.
	clients := newClients(t, 3, d.Addr, rec, dest, client.WithLedgerRetries(1), client.WithCallTimeout(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Agents that crash after EXECUTE: they never report.
	crashed := crashAgents(ctx, t, clients, dest, "crash", 9)

	l := newLoad(dest, clients, 6)
	finish := l.background(ctx, t, "lk")

	downs := []time.Duration{200 * time.Millisecond, 1500 * time.Millisecond, 500 * time.Millisecond}
	for i := range scale(3, 4) {
		sleepCtx(ctx, time.Second)
		d.kill()
		at := l.done.Load()
		down := downs[i%len(downs)]
		sleepCtx(ctx, down)
		d.restart(t)
		t.Logf("kill %d of ledgerd after %d operations settled; down %v, restarted on %s", i+1, at, down, d.Addr)
	}

	// The crashed agents' claims: the sweeper of the restarted ledgerd turns
	// them UNKNOWN once their lease ends, without anyone calling.
	for id, how := range crashed {
		o := waitState(ctx, t, clients[0], id, client.StateUnknown)
		if how == "applied, marked unknown" {
			continue
		}
		if e := last(o.History); e.Reason != "LEASE_EXPIRED" || e.Principal != "ledger" {
			t.Errorf("%s (%s): became UNKNOWN by %+v, want LEASE_EXPIRED by the sweeper", id, how, e)
		}
	}
	// They come back (a new call of the same operation) and reconcile.
	resolveCrashed(ctx, t, clients[0], dest, crashed)

	sleepCtx(ctx, time.Second)
	opIDs := finish()
	v := l.verify(context.Background(), t, clients[0], opIDs)
	abandoned, reconciled := 0, 0
	for _, id := range opIDs {
		o, err := clients[0].Lookup(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		lease, rec := false, false
		for _, h := range o.History {
			lease = lease || h.Reason == "LEASE_EXPIRED"
			rec = rec || lease && (h.Reason == "RECONCILED_APPLIED" || h.Reason == "RECONCILED_NOT_APPLIED")
		}
		if lease {
			abandoned++
		}
		if rec {
			reconciled++
		}
	}
	calls, unknown := rec.counts()
	t.Logf("%d operations: %s; %s", len(opIDs), v, dest)
	t.Logf("%d claims of the load were abandoned (LEASE_EXPIRED), %d of them then reconciled", abandoned, reconciled)
	t.Logf("ledger calls by the clients: %v, %d with an unknown outcome; Do errors retried: %s", calls, unknown, l.errors())
	rec.linearizable(t, false)
}

// crashAgents starts n operations whose agents crash after EXECUTE and
// never report: a third after the destination applied the effect, a third
// before calling it, a third after applying it and marking the attempt
// unknown. The claims are made at once, as by the agents of one host that
// dies, so their leases end together (and sweepers that run at once find
// them together). It returns how each crashed, by operation id.
func crashAgents(ctx context.Context, t testing.TB, clients []*client.Client, dest *destination, prefix string, n int) map[string]string {
	t.Helper()
	crashed := map[string]string{}
	rs := make([]*client.Reservation, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rs[i], errs[i] = clients[i%len(clients)].Reserve(ctx, op(fmt.Sprintf("%s-%d", prefix, i)), client.NewHolder())
		})
	}
	wg.Wait()
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		c := clients[i%len(clients)]
		r, err := rs[i], errs[i]
		if err != nil || r.Decision != client.DecisionExecute {
			t.Fatalf("Reserve(%s) = %v, %v", id, r, err)
		}
		a := client.Attempt{OperationID: id, IdempotencyKey: id, FencingToken: r.Operation.FencingToken, Number: r.Operation.Attempt}
		switch i % 3 {
		case 0:
			crashed[id] = "applied"
			forceApply(t, dest, a)
		case 1:
			crashed[id] = "not applied"
		case 2:
			crashed[id] = "applied, marked unknown"
			forceApply(t, dest, a)
			if _, err := c.MarkUnknown(ctx, id, a.FencingToken, "timeout"); err != nil {
				t.Fatal(err)
			}
		}
	}
	return crashed
}

// resolveCrashed brings the crashed agents back: each calls Do for its
// operation again, which reconciles it; each must end with exactly one
// effect, and Do must return it.
func resolveCrashed(ctx context.Context, t testing.TB, c *client.Client, dest *destination, crashed map[string]string) {
	t.Helper()
	for id, how := range crashed {
		var res client.Result
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; {
			res, err = c.Do(ctx, op(id), dest.fn)
			var failed *client.FailedError
			if err == nil || errors.As(err, &failed) || errors.Is(err, client.ErrKeyReused) || time.Now().After(deadline) {
				break
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
		if err != nil {
			t.Fatalf("%s (%s): Do after the crash: %v", id, how, err)
		}
		n, _, rid := dest.effects(id)
		if n != 1 || res.ResourceID != rid {
			t.Errorf("%s (%s): %d effects, Do returned %+v (the destination has %q)", id, how, n, res, rid)
		}
		o, err := c.Lookup(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("crashed agent %s (%s): %s", id, how, reasons(o))
	}
}

// forceApply applies an attempt's effect at the destination, with no
// injected failure.
func forceApply(t testing.TB, d *destination, a client.Attempt) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n++
	d.applied[a.OperationID] = append(d.applied[a.OperationID], a.FencingToken)
	d.rid[a.OperationID] = fmt.Sprintf("ch-%d", d.n)
}

// waitState polls an operation until it is in state want.
func waitState(ctx context.Context, t testing.TB, c *client.Client, id string, want client.State) *client.Operation {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		o, err := c.Lookup(ctx, id)
		if err == nil && o.State == want {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not %v within 30s: %+v, %v", id, want, o, err)
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

func last(h []client.HistoryEntry) client.HistoryEntry {
	if len(h) == 0 {
		return client.HistoryEntry{}
	}
	return h[len(h)-1]
}

func reasons(o *client.Operation) string {
	s := ""
	for i, h := range o.History {
		if i > 0 {
			s += " → "
		}
		s += h.Reason
		if h.Principal == "ledger" {
			s += " (sweeper)"
		}
	}
	return s
}
