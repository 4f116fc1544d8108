package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// testPolicy gives the tests short leases, retentions and recovery windows
// where they need them; everything else has the defaults (max_attempts lowered to 3).
const testPolicy = `
defaults:
  max_attempts: 3
tools:
  - match: "expiring.idempotent"
    effect: idempotent
    lease: 150ms
  - match: "expiring.*"
    lease: 150ms
  - match: "idempotent.*"
    effect: idempotent
  - match: "short.*"
    retention: 1s
    retain_grace: 0s
    tombstone_retention: 2s
  - match: "compact.fields"
    retention: 1s
    retain_grace: 0s
    tombstone_retention: 1h
    consequential_fields: ["/amount"]
  - match: "compact.*"
    retention: 1s
    retain_grace: 0s
    tombstone_retention: 1h
  - match: "fields.*"
    consequential_fields: ["/amount", "/currency"]
  - match: "overdue.*"
    recovery_window: 1ms
`

// env is one ledger on one backend, with a tenant of its own.
type env struct {
	l    *Ledger
	lrdb redis.UniversalClient // the ledger's client (restricted in redis-acl)
	rdb  redis.UniversalClient // for assertions
	who  Principal
	ctx  context.Context
}

// eachBackend runs f against a real redis-server (shared by the package,
// kept apart by a fresh tenant) and against the embedded engine.
func eachBackend(t *testing.T, f func(t *testing.T, e *env)) {
	t.Helper()
	pol, err := ParsePolicies([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f(t, newEnv(t, rdb, pol))
	})
	// And as the least-privileged Redis user of ACLRules, so a command the
	// rules lack fails the suite.
	t.Run("redis-acl", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Shared(t)
		aclOnce.Do(func() { srv.CreateUser(t, "ledger", "acl-test-password", ACLRules(DefaultPrefix)) })
		e := newEnv(t, srv.UserClient(t, "ledger", "acl-test-password"), pol)
		e.rdb = srv.Client(t) // assertions read as the admin user
		f(t, e)
	})
}

var aclOnce sync.Once

func newEnv(t *testing.T, rdb redis.UniversalClient, pol *Policies) *env {
	l, err := New(rdb, Options{Policies: pol})
	if err != nil {
		t.Fatal(err)
	}
	return &env{l: l, lrdb: rdb, rdb: rdb, who: Principal{Tenant: "t-" + randomHex(6), ID: "agent-1"}, ctx: context.Background()}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (e *env) reserve(t *testing.T, id, tool string, params map[string]any, holder string) *ReserveResult {
	t.Helper()
	res, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: id, Tool: tool, Params: params, Holder: holder, PermitID: "permit-1"})
	if err != nil {
		t.Fatalf("Reserve(%s): %v", id, err)
	}
	return res
}

func (e *env) execute(t *testing.T, id, tool string) *Operation {
	t.Helper()
	res := e.reserve(t, id, tool, map[string]any{"amount": 10.0}, "h-"+id)
	if res.Decision != DecisionExecute {
		t.Fatalf("Reserve(%s) = %v, want EXECUTE", id, res.Decision)
	}
	return res.Operation
}

// retryMustReconcile is an agent's retry of an operation whose effect may
// exist: the ledger must answer RECONCILE. An EXECUTE counts as one more
// effect at the destination (the caller then checks the count).
func (e *env) retryMustReconcile(t *testing.T, id, tool string, params map[string]any, holder string, applied *int) {
	t.Helper()
	switch r := e.reserve(t, id, tool, params, holder); r.Decision {
	case DecisionExecute:
		*applied++
	case DecisionReconcile:
	default:
		t.Fatalf("Reserve = %v, want RECONCILE", r.Decision)
	}
}

func (e *env) lookup(t *testing.T, id string) *Operation {
	t.Helper()
	o, err := e.l.Lookup(e.ctx, e.who, id)
	if err != nil {
		t.Fatalf("Lookup(%s): %v", id, err)
	}
	return o
}

func (e *env) complete(t *testing.T, id string, tok uint64, out Outcome, r *Result, f *Failure) (*Operation, error) {
	t.Helper()
	return e.l.Complete(e.ctx, e.who, CompleteRequest{OperationID: id, FencingToken: tok, Outcome: out, Result: r, Failure: f})
}

func (e *env) reconcile(t *testing.T, id string, f Finding, r *Result) (*Operation, error) {
	t.Helper()
	return e.l.Reconcile(e.ctx, e.who, ReconcileRequest{OperationID: id, Finding: f, Result: r})
}

func (e *env) markUnknown(t *testing.T, id string, tok uint64) (*Operation, error) {
	t.Helper()
	return e.l.MarkUnknown(e.ctx, e.who, MarkUnknownRequest{OperationID: id, FencingToken: tok, Reason: "timeout"})
}

// keys returns every key of the env's tenant and operation ids.
func (e *env) opKeys(id string) opKeys { return e.l.keys.op(e.who.Tenant, id) }

func reasons(o *Operation) []string {
	var out []string
	for _, h := range o.History {
		out = append(out, h.Reason)
	}
	return out
}

func wantKind(t *testing.T, err error, k Kind) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Kind != k {
		t.Fatalf("error = %v, want kind %v", err, k)
	}
	return e
}

// waitLeaseExpiry sleeps past a lease of the test policy's 150ms.
func waitLeaseExpiry() { time.Sleep(300 * time.Millisecond) }

// sweeps keeps one test's Sweep from moving another test's expired claim
// while that test looks at it as expired but not yet swept: the "redis"
// and "redis-acl" runs of a test share one redis-server and run in
// parallel, and a Sweep reaches every tenant's claims. Such a look holds
// the read lock (unswept); e.sweep holds the write lock.
var sweeps sync.RWMutex

// unswept runs f with no Sweep of any test running meanwhile.
func unswept(f func()) {
	sweeps.RLock()
	defer sweeps.RUnlock()
	f()
}

// sweep runs one Sweep pass of e's ledger.
func (e *env) sweep(t *testing.T) {
	t.Helper()
	sweeps.Lock()
	defer sweeps.Unlock()
	if _, err := e.l.Sweep(e.ctx); err != nil {
		t.Fatal(err)
	}
}

func nan() float64 { return math.NaN() }
