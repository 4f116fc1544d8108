package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

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
	pol, err := ParsePolicies([]byte(ledgertest.Policy))
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

// waitLeaseExpiry sleeps past an expiring.* lease (200ms).
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

// reserveAs reserves id for tool with effect (the policy's when
// unspecified) and fixed parameters, and fails the test on an error.
func (e *env) reserveAs(t *testing.T, id, tool string, effect Effect, holder string) *ReserveResult {
	t.Helper()
	res, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: id, Tool: tool, Params: map[string]any{"amount": 42.0},
		Effect: effect, PermitID: "permit-1", Holder: holder})
	if err != nil {
		t.Fatalf("Reserve(%s): %v", id, err)
	}
	return res
}

// claim reserves a new operation and checks it is EXECUTE.
func (e *env) claim(t *testing.T, id, tool string, effect Effect) *Operation {
	t.Helper()
	res := e.reserveAs(t, id, tool, effect, "h-"+randomHex(6))
	if res.Decision != DecisionExecute {
		t.Fatalf("Reserve(%s) = %v, want EXECUTE", id, res.Decision)
	}
	return res.Operation
}

// outcome returns what Complete reports with out: a result with resource
// id and receipt arg, or a failure of code arg.
func outcome(out Outcome, arg string) (*Result, *Failure) {
	if out == OutcomeSucceeded {
		return &Result{ResourceID: arg, Data: []byte(`{"receipt":"` + arg + `"}`)}, nil
	}
	return nil, &Failure{Code: arg, Message: "refused by the destination"}
}

// settle completes id with out (see outcome) and fails the test on an error.
func (e *env) settle(t *testing.T, id string, tok uint64, out Outcome, arg string) *Operation {
	t.Helper()
	r, f := outcome(out, arg)
	o, err := e.complete(t, id, tok, out, r, f)
	if err != nil {
		t.Fatalf("Complete(%s, %v): %v", id, out, err)
	}
	return o
}

// unknown marks id UNKNOWN and fails the test on an error.
func (e *env) unknown(t *testing.T, id string, tok uint64) *Operation {
	t.Helper()
	o, err := e.markUnknown(t, id, tok)
	if err != nil {
		t.Fatalf("MarkUnknown(%s): %v", id, err)
	}
	return o
}

// reconcileAs records finding f about id with a note, a result (APPLIED)
// or a failure (ABANDON).
func (e *env) reconcileAs(t *testing.T, id string, f Finding) (*Operation, error) {
	t.Helper()
	req := ReconcileRequest{OperationID: id, Finding: f, Note: "checked the destination"}
	switch f {
	case FindingApplied:
		req.Result, _ = outcome(OutcomeSucceeded, "R-found")
	case FindingAbandon:
		req.Failure = &Failure{Code: "gave_up", Message: "nothing at the destination"}
	}
	return e.l.Reconcile(e.ctx, e.who, req)
}

// lastEntry returns the latest history entry of id, by Lookup.
func (e *env) lastEntry(t *testing.T, id string) HistoryEntry {
	t.Helper()
	h := e.lookup(t, id).History
	return h[len(h)-1]
}

// wantUnchanged fails unless id's record is as before.
func (e *env) wantUnchanged(t *testing.T, id string, before *Operation) {
	t.Helper()
	if after := e.lookup(t, id); !reflect.DeepEqual(before, after) {
		t.Fatalf("the record changed:\nbefore %+v\nafter  %+v", before, after)
	}
}

// waitLeaseEnd waits until the store's clock is past the lease of o.
func (e *env) waitLeaseEnd(t *testing.T, o *Operation) {
	t.Helper()
	for {
		now, err := e.rdb.Time(e.ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.After(o.LeaseExpiresAt) {
			return
		}
		time.Sleep(o.LeaseExpiresAt.Sub(now) + 5*time.Millisecond)
	}
}

// expire waits past the lease of o and sweeps, as the sweeper would.
func (e *env) expire(t *testing.T, o *Operation) {
	t.Helper()
	e.waitLeaseEnd(t, o)
	e.sweep(t)
}
