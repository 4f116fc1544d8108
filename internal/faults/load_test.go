package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/opledger/ledger/client"
)

// tool is the destination's tool; the policy makes it irreversible, so a
// second execution would be a second effect.
const tool = "faults.charge"

// policyYAML is the ledger policy of the suite: lease is long against the
// clients' call timeout (so a claim cannot end while its EXECUTE answer is
// still on the way), and attempts are plenty for the injected failures.
func policyYAML(lease time.Duration) string {
	return fmt.Sprintf("defaults:\n  effect: irreversible\n  lease: %s\n  max_attempts: %d\n", lease, maxAttempts)
}

const maxAttempts = 30

// destination is a fake side-effecting service. It is not idempotent: every
// call that applies the effect applies it again, so a second execution of an
// operation shows as a second effect. It fails some calls on purpose: after
// applying the effect (the answer is lost: ambiguous), before applying it
// (ambiguous, or retryable: proven not applied), and some operations are
// refused for good (final).
type destination struct {
	faults bool // inject the failures above

	mu      sync.Mutex
	rng     *rand.Rand
	applied map[string][]uint64 // the tokens of the attempts that applied each operation's effect
	rid     map[string]string   // the resource the first effect created
	doomed  map[string]bool
	n       int

	calls, lostReply, notApplied, retryable, final, reconciled atomic.Int64
}

func newDestination(faults bool, seed uint64) *destination {
	return &destination{faults: faults, rng: rand.New(rand.NewPCG(seed, 7)),
		applied: map[string][]uint64{}, rid: map[string]string{}, doomed: map[string]bool{}}
}

var errDestination = errors.New("destination: no answer")

// doom makes the destination refuse an operation for good.
func (d *destination) doom(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.doomed[id] = true
}

// fn is the tool call Do runs on EXECUTE.
func (d *destination) fn(ctx context.Context, a client.Attempt) (client.Result, error) {
	d.calls.Add(1)
	if err := ctx.Err(); err != nil {
		return client.Result{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.doomed[a.OperationID] {
		d.final.Add(1)
		return client.Result{}, client.MarkFinal("card_declined", errors.New("destination: declined"))
	}
	mode := 0
	if d.faults {
		mode = d.rng.IntN(10)
	}
	switch mode {
	case 1: // the request never arrived, the caller cannot tell
		d.notApplied.Add(1)
		return client.Result{}, client.MarkAmbiguous(errDestination)
	case 2: // refused before acceptance: proven not applied
		d.retryable.Add(1)
		return client.Result{}, client.MarkRetryable(errors.New("destination: busy"))
	}
	d.n++
	d.applied[a.OperationID] = append(d.applied[a.OperationID], a.FencingToken)
	if _, ok := d.rid[a.OperationID]; !ok {
		d.rid[a.OperationID] = fmt.Sprintf("ch-%d", d.n)
	}
	res := client.Result{ResourceID: d.rid[a.OperationID], Data: map[string]any{"amount": 1250, "currency": "EUR"}}
	if mode == 3 { // applied, the answer is lost
		d.lostReply.Add(1)
		return client.Result{}, client.MarkAmbiguous(errDestination)
	}
	return res, nil
}

// reconcile asks the destination, by operation id, whether the effect
// exists: the client.Reconciler of the tool.
func (d *destination) reconcile(_ context.Context, o *client.Operation) (client.Finding, error) {
	d.reconciled.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.applied[o.ID]) > 0 {
		return client.Finding{Kind: client.Applied, Note: "found at the destination",
			Result: client.Result{ResourceID: d.rid[o.ID], Data: map[string]any{"amount": 1250, "currency": "EUR"}}}, nil
	}
	return client.Finding{Kind: client.NotApplied, Note: "not found at the destination"}, nil
}

// effects returns how many times an operation's effect was applied, and by
// which tokens.
func (d *destination) effects(id string) (int, []uint64, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.applied[id]), append([]uint64(nil), d.applied[id]...), d.rid[id]
}

func (d *destination) String() string {
	d.mu.Lock()
	n := d.n
	d.mu.Unlock()
	return fmt.Sprintf("destination: %d calls, %d effects; injected: %d answers lost after the effect, %d ambiguous without effect, %d retryable, %d final; %d reconciler lookups",
		d.calls.Load(), n, d.lostReply.Load(), d.notApplied.Load(), d.retryable.Load(), d.final.Load(), d.reconciled.Load())
}

// newClient returns an SDK client of the ledger at addr whose calls rec
// records, with the destination's reconciler, short backoffs and a quick
// reconnect (the suite restarts servers under it).
func newClient(t testing.TB, addr string, rec *recorder, d *destination, opts ...client.Option) *client.Client {
	t.Helper()
	bo := backoff.DefaultConfig
	bo.BaseDelay, bo.MaxDelay = 50*time.Millisecond, 500*time.Millisecond
	base := []client.Option{
		client.WithDialOptions(grpc.WithUnaryInterceptor(rec.interceptor()),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: time.Second})),
		client.WithReconciler(tool, d.reconcile),
		client.WithToolPolicy(tool, client.ToolPolicy{Timeout: 2 * time.Second, MaxRetries: 3}),
		client.WithBackoff(client.Backoff{Base: 20 * time.Millisecond, Max: 300 * time.Millisecond}),
		client.WithCallTimeout(2 * time.Second),
	}
	c, err := client.Dial(addr, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// op is the operation with id: the same request on every retry.
func op(id string) client.Op {
	return client.Op{ID: id, Tool: tool, Params: map[string]any{"charge": id, "amount": 1250}, PermitID: "permit-1"}
}

// load runs operations through client.Do from several workers, each
// operation twice (by two callers, often at once), retrying every Do until
// it settles: the way an agent runtime retries a step after a crash.
type load struct {
	dest    *destination
	clients []*client.Client
	workers int

	think time.Duration // a worker's pause between operations

	mu      sync.Mutex
	started []string
	outcome map[string]string // id -> "succeeded <rid>" or "failed <code>"
	errs    map[string]int    // Do errors by kind (then retried)
	done    atomic.Int64
}

// newClients returns n clients of the ledger at addr, as newClient makes
// them.
func newClients(t testing.TB, n int, addr string, rec *recorder, d *destination, opts ...client.Option) []*client.Client {
	clients := make([]*client.Client, n)
	for i := range clients {
		clients[i] = newClient(t, addr, rec, d, opts...)
	}
	return clients
}

func newLoad(d *destination, clients []*client.Client, workers int) *load {
	return &load{dest: d, clients: clients, workers: workers, think: 10 * time.Millisecond, outcome: map[string]string{}, errs: map[string]int{}}
}

// background runs l.run in the background until the returned function is
// called; that function waits for every started operation to settle and
// returns their ids.
func (l *load) background(ctx context.Context, t testing.TB, prefix string) (finish func() []string) {
	stop := make(chan struct{})
	var ids []string
	done := make(chan struct{})
	go func() { defer close(done); ids = l.run(ctx, t, prefix, 0, stop) }()
	return func() []string {
		close(stop)
		<-done
		return ids
	}
}

// run performs fresh operations, prefix-NNNN, each by two callers (the
// second a moment after the first, often while it runs), until stop is
// closed or n operations have started (n ≤ 0: no limit), and returns when
// every operation started has settled or ctx ends. Every fiftieth operation
// is one the destination refuses for good. It returns the ids.
func (l *load) run(ctx context.Context, t testing.TB, prefix string, n int, stop <-chan struct{}) []string {
	jobs := make(chan string, l.workers)
	go func() {
		defer close(jobs)
		for i := 0; ; i++ {
			stopped := n > 0 && i >= n
			if !stopped {
				select {
				case <-stop:
					stopped = true
				case <-ctx.Done():
					return
				default:
				}
			}
			if stopped {
				n = i
				break
			}
			id := fmt.Sprintf("%s-%04d", prefix, i)
			if i%50 == 17 {
				l.dest.doom(id)
			}
			l.mu.Lock()
			l.started = append(l.started, id)
			l.mu.Unlock()
			jobs <- id
			if i >= 2 {
				jobs <- fmt.Sprintf("%s-%04d", prefix, i-2)
			}
		}
		for i := max(n-2, 0); i < n; i++ {
			jobs <- fmt.Sprintf("%s-%04d", prefix, i)
		}
	}()
	var wg sync.WaitGroup
	for w := range l.workers {
		c := l.clients[w%len(l.clients)]
		wg.Go(func() {
			for id := range jobs {
				l.do(ctx, t, c, id)
				sleepCtx(ctx, l.think)
			}
		})
	}
	wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.started...)
}

// do runs one caller's Do of id until it settles.
func (l *load) do(ctx context.Context, t testing.TB, c *client.Client, id string) {
	for ctx.Err() == nil {
		res, err := c.Do(ctx, op(id), l.dest.fn)
		var failed *client.FailedError
		switch {
		case err == nil:
			l.settle(t, id, "succeeded "+res.ResourceID)
			return
		case errors.As(err, &failed):
			l.settle(t, id, "failed "+failed.Code)
			return
		case errors.Is(err, client.ErrKeyReused), errors.Is(err, client.ErrKeyExpired), errors.Is(err, client.ErrInvalidArgument):
			t.Errorf("Do(%s): %v", id, err)
			return
		}
		l.count(errKind(err))
		sleepCtx(ctx, 20*time.Millisecond+rand.N(80*time.Millisecond))
	}
}

// settle records how an operation ended for a caller; the two callers of
// an operation must agree.
func (l *load) settle(t testing.TB, id, outcome string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if prev, ok := l.outcome[id]; ok {
		if prev != outcome {
			t.Errorf("operation %s: one caller got %q, another %q", id, prev, outcome)
		}
		return
	}
	l.outcome[id] = outcome
	l.done.Add(1)
}

func (l *load) count(kind string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs[kind]++
}

func errKind(err error) string {
	switch {
	case errors.Is(err, client.ErrConflictingOutcome):
		return "effect recorded otherwise"
	case errors.Is(err, client.ErrCompletionNotRecorded):
		return "effect not recorded"
	case errors.Is(err, client.ErrRetriesExhausted):
		return "retries exhausted"
	case errors.Is(err, client.ErrNeedsReconciliation) && errors.Is(err, client.ErrUnavailable):
		// The reconciler had its finding, but the ledger could not record
		// it (a failing master): the operation is still UNKNOWN, and the
		// next Do reconciles it again.
		return "unavailable"
	case errors.Is(err, client.ErrNeedsReconciliation):
		return "needs reconciliation"
	case errors.Is(err, client.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, client.ErrStaleToken):
		return "stale token"
	case errors.Is(err, client.ErrNotFound):
		// The record the worker held a claim on is gone: a failover lost
		// its creation (WAIT 0).
		return "record lost"
	}
	return "other: " + err.Error()
}

// errorsBut counts the retried Do errors of other kinds than those given.
func (l *load) errorsBut(kinds ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for k, c := range l.errs {
		if !slices.Contains(kinds, k) {
			n += c
		}
	}
	return n
}

// errors returns the retried Do errors, sorted, for the log.
func (l *load) errors() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var parts []string
	for k, n := range l.errs {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// verdict is the business outcome of a load run.
type verdict struct {
	succeeded, failed, duplicates, unsettled int
}

func (v verdict) String() string {
	return fmt.Sprintf("%d SUCCEEDED, %d FAILED_FINAL, %d duplicate effects", v.succeeded, v.failed, v.duplicates)
}

// verify checks the business outcome of every operation and fails the test
// for anything wrong (see check).
func (l *load) verify(ctx context.Context, t testing.TB, c *client.Client, ids []string) verdict {
	t.Helper()
	return l.check(ctx, t, c, ids, t.Errorf)
}

// check checks the business outcome of every operation: settled, the
// ledger's record terminal and agreeing with what the callers got, and the
// destination's effects exactly one per SUCCEEDED operation and none per
// FAILED_FINAL one. Everything wrong goes to fail.
func (l *load) check(ctx context.Context, t testing.TB, c *client.Client, ids []string, fail func(string, ...any)) verdict {
	t.Helper()
	var v verdict
	for _, id := range ids {
		n, toks, rid := l.dest.effects(id)
		if n > 1 {
			v.duplicates += n - 1
			fail("operation %s: the effect was applied %d times (tokens %v)", id, n, toks)
		}
		l.mu.Lock()
		got, ok := l.outcome[id]
		l.mu.Unlock()
		if !ok {
			v.unsettled++
			fail("operation %s did not settle", id)
			continue
		}
		var o *client.Operation
		var err error
		for range 50 {
			if o, err = c.Lookup(ctx, id); err == nil || !errors.Is(err, client.ErrUnavailable) {
				break
			}
			sleepCtx(ctx, 100*time.Millisecond)
		}
		if err != nil {
			fail("Lookup(%s): %v", id, err)
			continue
		}
		switch o.State {
		case client.StateSucceeded:
			v.succeeded++
			if n != 1 {
				fail("operation %s is SUCCEEDED with %d effects", id, n)
			}
			if o.Result == nil || o.Result.ResourceID != rid || got != "succeeded "+rid {
				fail("operation %s: the destination made %q, the ledger recorded %+v, the callers got %q", id, rid, o.Result, got)
			}
		case client.StateFailedFinal:
			v.failed++
			if n != 0 {
				fail("operation %s is FAILED_FINAL (%s) with %d effects", id, o.Reason, n)
			}
			if !strings.HasPrefix(got, "failed ") {
				fail("operation %s is FAILED_FINAL, the callers got %q", id, got)
			}
		default:
			fail("operation %s settled for its callers but is %v", id, o.State)
		}
		if n > 1 {
			for _, h := range o.History {
				t.Logf("  %s: %v -> %v attempt %d token %d by %s (%s)", id, h.From, h.To, h.Attempt, h.FencingToken, h.Principal, h.Reason)
			}
		}
	}
	return v
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
