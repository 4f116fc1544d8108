package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The conformance scenarios of contract.md §9 (S1–S7, S9–S13; S8 is in
// security_test.go), end to end over gRPC against a real redis-server and
// the embedded engine. Each one counts how many times the fake destination
// applied the effect.

var (
	errRetryable = errors.New("503: refused before the request was accepted")
	errTimeout   = errors.New("deadline exceeded: the response never came")
)

// fault is what the destination does to one request.
type fault int

const (
	noFault           fault = iota
	failBeforeWrite         // refuses before writing: proven not applied
	timeoutAfterWrite       // writes, then the response is lost: ambiguous
	timeoutNoWrite          // nothing written, but the caller only sees a timeout
)

// destination applies every request it receives: it honours no idempotency
// key, like most real APIs. It can be asked, by operation id, whether an
// effect exists (what a reconciler does).
type destination struct {
	mu      sync.Mutex
	applied map[string][]string // operation id -> resources created
	total   int
	faults  []fault
	payload map[string]string // resource -> payload, to check what was applied
}

func newDestination(faults ...fault) *destination {
	return &destination{applied: map[string][]string{}, faults: faults, payload: map[string]string{}}
}

func (d *destination) apply(opID, payload string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := noFault
	if len(d.faults) > 0 {
		f, d.faults = d.faults[0], d.faults[1:]
	}
	switch f {
	case failBeforeWrite:
		return "", errRetryable
	case timeoutNoWrite:
		return "", errTimeout
	}
	d.total++
	rid := fmt.Sprintf("R-%d", d.total)
	d.applied[opID] = append(d.applied[opID], rid)
	d.payload[rid] = payload
	if f == timeoutAfterWrite {
		return "", errTimeout
	}
	return rid, nil
}

func (d *destination) find(opID string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rs := d.applied[opID]; len(rs) > 0 {
		return rs[0], true
	}
	return "", false
}

func (d *destination) count(opID string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.applied[opID])
}

func (d *destination) totalApplied() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.total
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func reserveReq(id, tool string, params *structpb.Struct, holder string) *ledgerv1.ReserveRequest {
	return &ledgerv1.ReserveRequest{OperationId: id, Tool: tool, Params: params, PermitId: "permit-1", Holder: holder}
}

// perform is one agent call of an operation done right with the raw stubs:
// Reserve, then execute, replay, wait or reconcile as the ledger decides,
// until there is a result. The holder is generated once for the call.
func (e *env) perform(t *testing.T, d *destination, id, tool string, params map[string]any) (string, error) {
	t.Helper()
	holder := newHolder()
	ps := mustStruct(t, params)
	payload := fmt.Sprint(params)
	for range 200 {
		res, err := e.c.Reserve(e.ctx, reserveReq(id, tool, ps, holder))
		if err != nil {
			return "", err
		}
		op := res.GetOperation()
		switch res.GetDecision() {
		case ledgerv1.Decision_DECISION_EXECUTE:
			rid, err := d.apply(id, payload)
			switch {
			case err == nil:
				c, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{
					OperationId: id, FencingToken: op.GetFencingToken(), Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED,
					Result: &ledgerv1.Result{ResourceId: rid, Data: mustStruct(t, map[string]any{"receipt": rid})},
				})
				if err != nil {
					return "", err
				}
				return c.GetOperation().GetResult().GetResourceId(), nil
			case errors.Is(err, errRetryable):
				if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{
					OperationId: id, FencingToken: op.GetFencingToken(), Outcome: ledgerv1.Outcome_OUTCOME_FAILED_RETRYABLE,
					Failure: &ledgerv1.Failure{Code: "503"},
				}); err != nil {
					return "", err
				}
			default: // ambiguous: the effect may or may not exist
				if _, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: op.GetFencingToken(), Reason: "timeout"}); err != nil {
					return "", err
				}
			}
		case ledgerv1.Decision_DECISION_REPLAY:
			if op.GetState() == ledgerv1.State_STATE_SUCCEEDED {
				return op.GetResult().GetResourceId(), nil
			}
			return "", fmt.Errorf("operation failed: %s (%s)", op.GetFailure().GetCode(), op.GetReason())
		case ledgerv1.Decision_DECISION_IN_PROGRESS:
			time.Sleep(res.GetRetryAfter().AsDuration())
		case ledgerv1.Decision_DECISION_RECONCILE:
			req := &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_NOT_APPLIED}
			if rid, ok := d.find(id); ok {
				req = &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_APPLIED,
					Result: &ledgerv1.Result{ResourceId: rid, Data: mustStruct(t, map[string]any{"receipt": rid})}}
			}
			if _, err := e.c.Reconcile(e.ctx, req); err != nil {
				// Another caller reconciled first: read the record again.
				if c, ei, _ := errorInfo(t, err); c != codes.FailedPrecondition || ei.Reason == "" {
					return "", err
				}
			}
		default:
			return "", fmt.Errorf("decision %v", res.GetDecision())
		}
	}
	return "", errors.New("no result after 200 rounds")
}

func TestS1ConcurrentReserveExecutesOnce(t *testing.T) {
	for _, callers := range []int{2, 64} {
		t.Run(fmt.Sprint(callers), func(t *testing.T) {
			eachBackend(t, func(t *testing.T, e *env) {
				d := newDestination()
				id := e.id("refund")
				var executes atomic.Int32
				results := make([]string, callers)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i := range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						res, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 42}), newHolder()))
						if err != nil {
							t.Error(err)
							return
						}
						if res.Decision == ledgerv1.Decision_DECISION_EXECUTE {
							executes.Add(1)
							rid, _ := d.apply(id, "42")
							if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: res.Operation.FencingToken,
								Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: rid}}); err != nil {
								t.Error(err)
							}
						} else if res.Decision != ledgerv1.Decision_DECISION_IN_PROGRESS && res.Decision != ledgerv1.Decision_DECISION_REPLAY {
							t.Errorf("decision %v", res.Decision)
						}
						// Then every caller does the whole call and gets the one result.
						results[i], err = e.perform(t, d, id, "payments.refund", map[string]any{"amount": 42})
						if err != nil {
							t.Error(err)
						}
					}()
				}
				close(start)
				wg.Wait()
				if n := executes.Load(); n != 1 {
					t.Fatalf("%d callers got EXECUTE, want 1", n)
				}
				if n := d.count(id); n != 1 {
					t.Fatalf("the destination applied the effect %d times, want 1", n)
				}
				for _, r := range results {
					if r != results[0] || r == "" {
						t.Fatalf("results differ: %v", results)
					}
				}
			})
		})
	}
}

func TestS2ResponseLostRetryReplays(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := newDestination()
		id := e.id("refund")
		params := mustStruct(t, map[string]any{"amount": 42, "currency": "EUR"})
		res, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", params, newHolder()))
		if err != nil || res.Decision != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("Reserve = %v, %v", res, err)
		}
		rid, _ := d.apply(id, "42 EUR")
		complete := &ledgerv1.CompleteRequest{OperationId: id, FencingToken: res.Operation.FencingToken,
			Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: rid, Data: mustStruct(t, map[string]any{"receipt": rid})}}
		if _, err := e.c.Complete(e.ctx, complete); err != nil {
			t.Fatal(err)
		}
		// The agent never saw the response: it retries the whole call.
		got, err := e.perform(t, d, id, "payments.refund", map[string]any{"currency": "EUR", "amount": 42})
		if err != nil || got != rid {
			t.Fatalf("retry = %q, %v; want the replayed %q", got, err, rid)
		}
		// And the Complete itself, retried, is the same success.
		again, err := e.c.Complete(e.ctx, complete)
		if err != nil || again.Operation.Result.ResourceId != rid {
			t.Fatalf("Complete retried = %v, %v", again, err)
		}
		if n := d.count(id); n != 1 {
			t.Fatalf("the destination applied the effect %d times, want 1", n)
		}
	})
}

func TestS3WorkerDiesAfterEffect(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := newDestination()
		id := e.id("refund")
		params := mustStruct(t, map[string]any{"amount": 42})
		res, err := e.c.Reserve(e.ctx, reserveReq(id, "expiring.refund", params, newHolder()))
		if err != nil || res.Decision != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("Reserve = %v, %v", res, err)
		}
		rid, _ := d.apply(id, "42")
		// The worker dies here. The sweeper turns the expired claim UNKNOWN.
		deadline := time.Now().Add(10 * time.Second)
		for e.lookup(t, id).State != ledgerv1.State_STATE_UNKNOWN {
			if time.Now().After(deadline) {
				t.Fatal("the expired claim never became UNKNOWN")
			}
			time.Sleep(50 * time.Millisecond)
		}
		op := e.lookup(t, id)
		if op.Reason != "LEASE_EXPIRED" || op.History[len(op.History)-1].Principal != "ledger" {
			t.Fatalf("UNKNOWN record = %v", op)
		}
		// A new caller is told to reconcile, not to execute.
		res, err = e.c.Reserve(e.ctx, reserveReq(id, "expiring.refund", params, newHolder()))
		if err != nil || res.Decision != ledgerv1.Decision_DECISION_RECONCILE {
			t.Fatalf("Reserve after expiry = %v, %v", res, err)
		}
		found, ok := d.find(id)
		if !ok {
			t.Fatal("destination lost the effect")
		}
		rec, err := e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_APPLIED,
			Result: &ledgerv1.Result{ResourceId: found}, Note: "found at the destination"})
		if err != nil || rec.Operation.State != ledgerv1.State_STATE_SUCCEEDED {
			t.Fatalf("Reconcile = %v, %v", rec, err)
		}
		got, err := e.perform(t, d, id, "expiring.refund", map[string]any{"amount": 42})
		if err != nil || got != rid {
			t.Fatalf("after reconciliation = %q, %v", got, err)
		}
		if n := d.count(id); n != 1 {
			t.Fatalf("the destination applied the effect %d times, want 1", n)
		}
	})
}

func TestS4SameKeyDifferentParamsRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := newDestination()
		id := e.id("refund")
		rid, err := e.perform(t, d, id, "payments.refund", map[string]any{"amount": 42, "memo": "damaged parcel"})
		if err != nil {
			t.Fatal(err)
		}
		before := e.lookup(t, id)
		for _, tc := range []struct {
			params map[string]any
			tool   string
			permit string
			differ string
		}{
			{map[string]any{"amount": 4200, "memo": "damaged parcel"}, "payments.refund", "permit-1", "params"},
			{map[string]any{"amount": 42, "memo": "damaged parcel, refund twice"}, "payments.refund", "permit-1", "params"},
			{map[string]any{"amount": 42, "memo": "damaged parcel"}, "payments.payout", "permit-1", "tool"},
			{map[string]any{"amount": 42, "memo": "damaged parcel"}, "payments.refund", "permit-2", "permit"},
		} {
			req := reserveReq(id, tc.tool, mustStruct(t, tc.params), newHolder())
			req.PermitId = tc.permit
			_, err := e.c.Reserve(e.ctx, req)
			ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
			if ei.Metadata["differs"] != tc.differ {
				t.Errorf("differs = %q, want %q", ei.Metadata["differs"], tc.differ)
			}
			if strings.Contains(status.Convert(err).Message(), "4200") || strings.Contains(status.Convert(err).Message(), "twice") {
				t.Errorf("the error names a value: %v", err)
			}
		}
		if after := e.lookup(t, id); !proto.Equal(before, after) {
			t.Fatalf("record changed:\n%v\n%v", before, after)
		}
		if got, err := e.perform(t, d, id, "payments.refund", map[string]any{"memo": "damaged parcel", "amount": 42}); err != nil || got != rid {
			t.Fatalf("the original request = %q, %v", got, err)
		}
		if n := d.count(id); n != 1 {
			t.Fatalf("the destination applied the effect %d times, want 1", n)
		}
	})
}

func TestS5TimeoutThenReconciliation(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// (a) The effect happened; the response was lost.
		d := newDestination(timeoutAfterWrite)
		id := e.id("applied")
		got, err := e.perform(t, d, id, "payments.refund", map[string]any{"amount": 1})
		if err != nil || got != "R-1" {
			t.Fatalf("applied case = %q, %v", got, err)
		}
		if n := d.count(id); n != 1 {
			t.Fatalf("applied case: the effect applied %d times, want 1", n)
		}
		if r := reasonsOf(e.lookup(t, id)); !slices.Equal(r, []string{"RESERVED", "MARKED_UNKNOWN", "RECONCILED_APPLIED"}) {
			t.Fatalf("applied case history = %v", r)
		}

		// (b) Nothing happened; the caller only saw a timeout.
		d = newDestination(timeoutNoWrite)
		id = e.id("not-applied")
		got, err = e.perform(t, d, id, "payments.refund", map[string]any{"amount": 1})
		if err != nil || got == "" {
			t.Fatalf("not-applied case = %q, %v", got, err)
		}
		if n := d.count(id); n != 1 {
			t.Fatalf("not-applied case: the effect applied %d times, want 1", n)
		}
		op := e.lookup(t, id)
		if r := reasonsOf(op); !slices.Equal(r, []string{"RESERVED", "MARKED_UNKNOWN", "RECONCILED_NOT_APPLIED", "CLAIMED", "SUCCEEDED"}) || op.Attempt != 2 {
			t.Fatalf("not-applied case: attempt %d, history %v", op.Attempt, r)
		}
	})
}

// TestS6ExpiredOrUnreachableNeverExecutes: once a terminal record has
// expired, a late replay of the call (a new holder, as from a queue) is
// refused with IDEMPOTENCY_KEY_EXPIRED naming the final state, other
// parameters under the key with IDEMPOTENCY_KEY_REUSED, and nothing runs
// again; with the store unreachable, a call is refused with UNAVAILABLE
// and nothing runs at all.
func TestS6ExpiredOrUnreachableNeverExecutes(t *testing.T) {
	t.Run("expired", func(t *testing.T) {
		eachBackend(t, func(t *testing.T, e *env) {
			d := newDestination()
			id := e.id("refund")
			params := map[string]any{"amount": 42}
			rid, err := e.perform(t, d, id, "compact.refund", params)
			if err != nil {
				t.Fatal(err)
			}
			// compact.* records live 1 s, then their tombstone 1 h.
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: id})
				if err != nil {
					wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_EXPIRED")
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the record never expired")
				}
				time.Sleep(100 * time.Millisecond)
			}
			for range 2 {
				got, err := e.perform(t, d, id, "compact.refund", params)
				if ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_EXPIRED"); ei.Metadata["final_state"] != "STATE_SUCCEEDED" || got != "" {
					t.Fatalf("late replay = %q, %v", got, ei.Metadata)
				}
				// Other parameters under the expired key are no late replay:
				// the tombstone keeps the fingerprint, and the old outcome
				// is not theirs (S4).
				got, err = e.perform(t, d, id, "compact.refund", map[string]any{"amount": 4200})
				if ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED"); ei.Metadata["differs"] != "params" || got != "" {
					t.Fatalf("other parameters under the expired key = %q, %v", got, ei.Metadata)
				}
			}
			if n := d.count(id); n != 1 {
				t.Fatalf("the destination applied the effect %d times, want 1 (%s)", n, rid)
			}
		})
	})

	t.Run("store unreachable", func(t *testing.T) {
		srv := redistest.Start(t)
		e := startEnv(t, srv.Client(t))
		srv.Stop()
		d := newDestination()
		for range 2 {
			_, err := e.perform(t, d, e.id("refund"), "payments.refund", map[string]any{"amount": 42})
			wantReason(t, err, codes.Unavailable, "STORE_UNAVAILABLE")
		}
		if n := d.totalApplied(); n != 0 {
			t.Fatalf("the destination applied the effect %d times without a reservation, want 0", n)
		}
	})
}

// TestS7RestartWhileUnknown: two operations are UNKNOWN (one applied at the
// destination, one not) when both the ledger and redis-server (with AOF)
// are killed. After the restart, a new ledger instance shows both as they
// were, and each resolves by reconciliation: one effect each.
func TestS7RestartWhileUnknown(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	e := startEnv(t, srv.Client(t))
	d := newDestination()
	params := map[string]any{"amount": 42}
	applied, notApplied := e.id("applied"), e.id("not-applied")
	before := map[string]*ledgerv1.Operation{}
	for _, id := range []string{applied, notApplied} {
		res, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", mustStruct(t, params), newHolder()))
		if err != nil || res.Decision != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("Reserve(%s) = %v, %v", id, res, err)
		}
		if id == applied {
			if _, err := d.apply(id, "42"); err != nil {
				t.Fatal(err)
			}
		}
		e.markUnknown(t, id, res.Operation.FencingToken)
		before[id] = e.lookup(t, id)
	}

	e.stop()
	srv.Stop() // SIGKILL
	srv.Restart(t)
	after := startEnv(t, srv.Client(t))
	for id, op := range before {
		if got := after.lookup(t, id); !proto.Equal(got, op) {
			t.Fatalf("%s after the restarts:\n%v\nwant\n%v", id, got, op)
		}
	}
	got, err := after.perform(t, d, applied, "payments.refund", params)
	if err != nil || got != "R-1" {
		t.Fatalf("the applied operation after the restarts = %q, %v; want R-1 found by reconciliation", got, err)
	}
	if got, err := after.perform(t, d, notApplied, "payments.refund", params); err != nil || got != "R-2" {
		t.Fatalf("the operation not applied after the restarts = %q, %v; want it executed once (R-2)", got, err)
	}
	for id, want := range map[string][]string{
		applied:    {"RESERVED", "MARKED_UNKNOWN", "RECONCILED_APPLIED"},
		notApplied: {"RESERVED", "MARKED_UNKNOWN", "RECONCILED_NOT_APPLIED", "CLAIMED", "SUCCEEDED"},
	} {
		if n := d.count(id); n != 1 {
			t.Errorf("%s: the destination applied the effect %d times, want 1", id, n)
		}
		if r := reasonsOf(after.lookup(t, id)); !slices.Equal(r, want) {
			t.Errorf("%s: history %v, want %v", id, r, want)
		}
	}
}

func TestS9AppointmentWithFaults(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// create_appointment: refuses the first request before writing, and
		// loses the response of the second after writing.
		appt := newDestination(failBeforeWrite, timeoutAfterWrite)
		id := e.id("book-dentist")
		slot := map[string]any{"patient": "p-17", "clinic": "c-2", "start": "2099-02-14T09:30:00Z"}

		// Sends 1 and 2 run concurrently, through the faults before the
		// write and after the write before the response.
		var wg sync.WaitGroup
		got := make([]string, 5)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if got[i], err = e.perform(t, appt, id, "create_appointment", slot); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		// Send 3: the agent got the response but crashed before saving its
		// state, and sends the operation again; then 4 and 5.
		for i := 2; i < 5; i++ {
			var err error
			if got[i], err = e.perform(t, appt, id, "create_appointment", slot); err != nil {
				t.Fatal(err)
			}
		}
		if n := appt.count(id); n != 1 {
			t.Fatalf("%d appointments exist, want exactly 1", n)
		}
		for i, g := range got {
			if g != got[0] || g == "" {
				t.Fatalf("send %d returned %q, want %q", i+1, g, got[0])
			}
		}
		// A different payload under the key is refused.
		other := map[string]any{"patient": "p-17", "clinic": "c-2", "start": "2099-02-15T09:30:00Z"}
		_, err := e.perform(t, appt, id, "create_appointment", other)
		wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
		// A new key is a new intent: a second appointment.
		second, err := e.perform(t, appt, e.id("book-dentist-again"), "create_appointment", slot)
		if err != nil || second == got[0] {
			t.Fatalf("new key = %q, %v", second, err)
		}
		if n := appt.totalApplied(); n != 2 {
			t.Fatalf("%d appointments in all, want 2", n)
		}
		// No parameter value or result reached the logs. The slot is a
		// whole timestamp, so a log line's own time cannot match it.
		logs := e.logs.String()
		for _, secret := range []string{"p-17", "c-2", slot["start"].(string), "receipt", got[0]} {
			if strings.Contains(logs, secret) {
				t.Fatalf("the log holds %q", secret)
			}
		}
		if !strings.Contains(logs, "book-dentist") {
			t.Fatal("the log lacks the operation id")
		}
	})
}

// dropper is a client interceptor that, when armed for a method, lets the
// call reach the server and then loses its response.
type dropper struct {
	mu    sync.Mutex
	armed map[string]bool
}

func (d *dropper) arm(method string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed[method] = true
}

func (d *dropper) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	d.mu.Lock()
	defer d.mu.Unlock()
	name := method[strings.LastIndexByte(method, '/')+1:]
	if d.armed[name] {
		delete(d.armed, name)
		return status.Error(codes.Unavailable, "response lost")
	}
	return err
}

func TestS10LostReserveResponseRecovered(t *testing.T) {
	eachBackend(t, func(t *testing.T, base *env) {
		dr := &dropper{armed: map[string]bool{}}
		e := startEnv(t, base.rdb, grpc.WithChainUnaryInterceptor(dr.intercept))
		d := newDestination()
		id := e.id("refund")
		holder := newHolder()
		req := reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 42}), holder)
		dr.arm("Reserve")
		if _, err := e.c.Reserve(e.ctx, req); status.Code(err) != codes.Unavailable {
			t.Fatalf("first Reserve = %v, want the lost response", err)
		}
		// Meanwhile another caller is kept out.
		other, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 42}), newHolder()))
		if err != nil || other.Decision != ledgerv1.Decision_DECISION_IN_PROGRESS {
			t.Fatalf("other caller = %v, %v", other, err)
		}
		res, err := e.c.Reserve(e.ctx, req)
		if err != nil || res.Decision != ledgerv1.Decision_DECISION_EXECUTE || res.Operation.Attempt != 1 {
			t.Fatalf("retry with the same holder = %v, %v", res, err)
		}
		lost := e.lookup(t, id)
		if res.Operation.FencingToken != lost.FencingToken || len(lost.History) != 1 {
			t.Fatalf("token %d vs %d, history %d", res.Operation.FencingToken, lost.FencingToken, len(lost.History))
		}
		rid, _ := d.apply(id, "42")
		if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: res.Operation.FencingToken,
			Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: rid}}); err != nil {
			t.Fatal(err)
		}
		if n := d.count(id); n != 1 {
			t.Fatalf("the destination applied the effect %d times, want 1", n)
		}
	})
}

// fencedStore is a destination that honours fencing tokens: it refuses a
// write carrying an older token than one it has seen.
type fencedStore struct {
	mu      sync.Mutex
	highest uint64
	value   string
	writes  int
}

func (f *fencedStore) write(token uint64, v string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if token < f.highest {
		return errors.New("stale token")
	}
	f.highest, f.value = token, v
	f.writes++
	return nil
}

func TestS11FencedWorkerCannotOverwrite(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		id := e.id("sync-profile")
		params := mustStruct(t, map[string]any{"profile": "p-1"})
		a, err := e.c.Reserve(e.ctx, reserveReq(id, "expiring.idempotent", params, newHolder()))
		if err != nil || a.Decision != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("worker A = %v, %v", a, err)
		}
		// Worker A stalls past its lease; worker B takes over.
		e.waitLeaseEnd(t, a.Operation)
		b, err := e.c.Reserve(e.ctx, reserveReq(id, "expiring.idempotent", params, newHolder()))
		if err != nil || b.Decision != ledgerv1.Decision_DECISION_EXECUTE || b.Operation.FencingToken <= a.Operation.FencingToken {
			t.Fatalf("worker B = %v, %v", b, err)
		}
		store := &fencedStore{}
		if err := store.write(b.Operation.FencingToken, "B"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: b.Operation.FencingToken,
			Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: "B"}}); err != nil {
			t.Fatal(err)
		}
		// A wakes up: the destination and the ledger both refuse it.
		if err := store.write(a.Operation.FencingToken, "A"); err == nil {
			t.Fatal("the fenced destination accepted the stale write")
		}
		_, err = e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: a.Operation.FencingToken,
			Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: "A"}})
		wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN")
		_, err = e.c.Renew(e.ctx, &ledgerv1.RenewRequest{OperationId: id, FencingToken: a.Operation.FencingToken})
		wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN")
		if op := e.lookup(t, id); op.Result.ResourceId != "B" || store.value != "B" || store.writes != 1 {
			t.Fatalf("record %v, store %q after %d writes", op.Result, store.value, store.writes)
		}
	})
}

func TestS12EveryRPCSafeToRetry(t *testing.T) {
	eachBackend(t, func(t *testing.T, base *env) {
		dr := &dropper{armed: map[string]bool{}}
		e := startEnv(t, base.rdb, grpc.WithChainUnaryInterceptor(dr.intercept))
		// twice sends a call whose response is lost, then sends it again, and
		// returns the second response.
		twice := func(method string, call func() (proto.Message, error)) proto.Message {
			t.Helper()
			dr.arm(method)
			if _, err := call(); status.Code(err) != codes.Unavailable {
				t.Fatalf("%s: first call = %v, want the lost response", method, err)
			}
			m, err := call()
			if err != nil {
				t.Fatalf("%s retried: %v", method, err)
			}
			return m
		}
		d := newDestination()
		id := e.id("op")
		holder := newHolder()
		req := reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 42}), holder)
		res := twice("Reserve", func() (proto.Message, error) { return e.c.Reserve(e.ctx, req) }).(*ledgerv1.ReserveResponse)
		if res.Decision != ledgerv1.Decision_DECISION_EXECUTE || res.Operation.Attempt != 1 {
			t.Fatalf("Reserve = %v", res)
		}
		tok := res.Operation.FencingToken
		twice("Renew", func() (proto.Message, error) {
			return e.c.Renew(e.ctx, &ledgerv1.RenewRequest{OperationId: id, FencingToken: tok})
		})
		if _, err := d.apply(id, "42"); err != nil {
			t.Fatal(err)
		}
		twice("MarkUnknown", func() (proto.Message, error) {
			return e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: tok, Reason: "timeout"})
		})
		twice("Reconcile", func() (proto.Message, error) {
			return e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_ESCALATE})
		})
		list := twice("ListUnresolved", func() (proto.Message, error) {
			return e.c.ListUnresolved(e.ctx, &ledgerv1.ListUnresolvedRequest{PageSize: 1000})
		}).(*ledgerv1.ListUnresolvedResponse)
		if !slices.ContainsFunc(list.Operations, func(o *ledgerv1.Operation) bool { return o.OperationId == id && o.NeedsReview }) {
			t.Fatalf("ListUnresolved lacks the escalated operation")
		}
		rid, _ := d.find(id)
		rec := twice("Reconcile", func() (proto.Message, error) {
			return e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_APPLIED, Result: &ledgerv1.Result{ResourceId: rid}})
		}).(*ledgerv1.ReconcileResponse)
		if rec.Operation.State != ledgerv1.State_STATE_SUCCEEDED {
			t.Fatalf("Reconcile = %v", rec)
		}
		look := twice("Lookup", func() (proto.Message, error) {
			return e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: id})
		}).(*ledgerv1.LookupResponse)
		want := []string{"RESERVED", "MARKED_UNKNOWN", "ESCALATED", "RECONCILED_APPLIED"}
		if r := reasonsOf(look.Operation); !slices.Equal(r, want) {
			t.Fatalf("history %v, want %v: a retried call left a trace", r, want)
		}

		// Complete, on a second operation.
		id2 := e.id("op2")
		res2, err := e.c.Reserve(e.ctx, reserveReq(id2, "payments.refund", mustStruct(t, map[string]any{"amount": 1}), newHolder()))
		if err != nil {
			t.Fatal(err)
		}
		rid2, _ := d.apply(id2, "1")
		done := twice("Complete", func() (proto.Message, error) {
			return e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id2, FencingToken: res2.Operation.FencingToken,
				Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: rid2}})
		}).(*ledgerv1.CompleteResponse)
		if done.Operation.State != ledgerv1.State_STATE_SUCCEEDED || len(e.lookup(t, id2).History) != 2 {
			t.Fatalf("Complete = %v", done)
		}
		if d.totalApplied() != 2 {
			t.Fatalf("%d effects, want 2", d.totalApplied())
		}
	})
}

func TestS13RetriesExhausted(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := newDestination(failBeforeWrite, failBeforeWrite, failBeforeWrite, failBeforeWrite)
		id := e.id("refund")
		_, err := e.perform(t, d, id, "payments.refund", map[string]any{"amount": 42})
		if err == nil || !strings.Contains(err.Error(), "RETRIES_EXHAUSTED") {
			t.Fatalf("perform = %v, want the operation to fail with RETRIES_EXHAUSTED", err)
		}
		op := e.lookup(t, id)
		if op.State != ledgerv1.State_STATE_FAILED_FINAL || op.Reason != "RETRIES_EXHAUSTED" || op.Attempt != 3 {
			t.Fatalf("record = %v", op)
		}
		if n := d.count(id); n != 0 {
			t.Fatalf("the destination applied the effect %d times, want 0", n)
		}
		// And it stays failed: no fourth attempt.
		res, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 42}), newHolder()))
		if err != nil || res.Decision != ledgerv1.Decision_DECISION_REPLAY {
			t.Fatalf("Reserve after exhaustion = %v, %v", res, err)
		}
	})
}

func reasonsOf(o *ledgerv1.Operation) []string {
	var out []string
	for _, h := range o.History {
		out = append(out, h.Reason)
	}
	return out
}

// TestS1AcrossThreeInstances: 64 callers of one operation spread over three
// ledger services sharing one store get exactly one EXECUTE.
func TestS1AcrossThreeInstances(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		envs := []*env{startEnv(t, rdb), startEnv(t, rdb), startEnv(t, rdb)}
		d := newDestination()
		id := envs[0].id("refund")
		var executes atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 64 {
			e := envs[i%3]
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 42}), newHolder()))
				if err != nil {
					t.Error(err)
					return
				}
				if res.Decision == ledgerv1.Decision_DECISION_EXECUTE {
					executes.Add(1)
					rid, _ := d.apply(id, "42")
					if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: res.Operation.FencingToken,
						Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: rid}}); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		if n := executes.Load(); n != 1 {
			t.Fatalf("%d callers got EXECUTE across three instances, want 1", n)
		}
		if n := d.count(id); n != 1 {
			t.Fatalf("the destination applied the effect %d times, want 1", n)
		}
		for _, e := range envs {
			if got, err := e.perform(t, d, id, "payments.refund", map[string]any{"amount": 42}); err != nil || got != "R-1" {
				t.Fatalf("replay through another instance = %q, %v", got, err)
			}
		}
	})
}

// TestS12ReconcileOfAPendingOperationRepeated: a reconciler finds nothing at
// the destination for an operation that is already PENDING (its attempt
// failed before the write), and the answer is lost. The next attempt applies
// the effect, its worker dies, and the lease expiry makes the operation
// UNKNOWN. Then the reconciler's call arrives again. It took effect once and
// must change nothing now: turning the UNKNOWN attempt back to PENDING would
// let a third attempt refund a second time. With its fencing token it is
// the repeat of a call about attempt 1 (OK); without one it cannot say it
// is not about attempt 2, and is refused (STALE_FENCING_TOKEN).
func TestS12ReconcileOfAPendingOperationRepeated(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		name := "without a fencing token"
		if fenced {
			name = "with the fencing token"
		}
		t.Run(name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, base *env) {
				dr := &dropper{armed: map[string]bool{}}
				e := startEnv(t, base.rdb, grpc.WithChainUnaryInterceptor(dr.intercept))
				d := newDestination(failBeforeWrite)
				id := e.id("refund")
				params := map[string]any{"amount": 42}

				// Attempt 1 is refused before the write: PENDING.
				first, err := e.c.Reserve(e.ctx, reserveReq(id, "expiring.refund", mustStruct(t, params), newHolder()))
				if err != nil || first.Decision != ledgerv1.Decision_DECISION_EXECUTE {
					t.Fatalf("Reserve = %v, %v", first, err)
				}
				if _, err := d.apply(id, "42"); err == nil {
					t.Fatal("the destination accepted the first request")
				}
				if _, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: first.Operation.FencingToken,
					Outcome: ledgerv1.Outcome_OUTCOME_FAILED_RETRYABLE, Failure: &ledgerv1.Failure{Code: "503"}}); err != nil {
					t.Fatal(err)
				}

				// The reconciler looks at the PENDING operation: nothing at
				// the destination. Its answer is lost.
				finding := &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_NOT_APPLIED, Note: "no refund at the bank"}
				if fenced {
					finding.FencingToken = first.Operation.FencingToken
				}
				dr.arm("Reconcile")
				if _, err := e.c.Reconcile(e.ctx, finding); status.Code(err) != codes.Unavailable {
					t.Fatalf("Reconcile = %v, want the lost response", err)
				}

				// Attempt 2 refunds; its worker dies before Complete.
				second, err := e.c.Reserve(e.ctx, reserveReq(id, "expiring.refund", mustStruct(t, params), newHolder()))
				if err != nil || second.Decision != ledgerv1.Decision_DECISION_EXECUTE || second.Operation.Attempt != 2 {
					t.Fatalf("Reserve = %v, %v; want EXECUTE attempt 2", second, err)
				}
				if _, err := d.apply(id, "42"); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(10 * time.Second)
				for e.lookup(t, id).State != ledgerv1.State_STATE_UNKNOWN {
					if time.Now().After(deadline) {
						t.Fatal("the expired claim never became UNKNOWN")
					}
					time.Sleep(50 * time.Millisecond)
				}
				before := e.lookup(t, id)

				// The reconciler's call arrives again: the same outcome as
				// the one call, and nothing changes.
				again, err := e.c.Reconcile(e.ctx, finding)
				switch {
				case !fenced:
					wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN")
				case err != nil:
					t.Fatalf("repeated Reconcile: %v, want OK (it took effect)", err)
				case again.Operation.State != ledgerv1.State_STATE_UNKNOWN || again.Operation.Attempt != 2:
					t.Fatalf("after the repeat: %v attempt %d, want UNKNOWN attempt 2", again.Operation.State, again.Operation.Attempt)
				}
				if got, want := reasonsOf(e.lookup(t, id)), reasonsOf(before); len(got) != len(want) {
					t.Fatalf("history %v, want it unchanged: %v", got, want)
				}

				// The agent retries the call: it reconciles, finds the
				// refund, and replays it.
				got, err := e.perform(t, d, id, "expiring.refund", params)
				if err != nil || got == "" {
					t.Fatalf("retry = %q, %v", got, err)
				}
				if n := d.count(id); n != 1 {
					t.Fatalf("the destination refunded %d times, want 1", n)
				}
			})
		})
	}
}

// TestS12RepeatAfterTheRecordMovedOn: a worker's Complete or MarkUnknown
// whose answer was lost is sent again after the operation moved on to the
// next attempt. It took effect, so the repeat answers OK and changes nothing:
// the next attempt's claim, and the effect it applies, stand alone.
func TestS12RepeatAfterTheRecordMovedOn(t *testing.T) {
	eachBackend(t, func(t *testing.T, base *env) {
		dr := &dropper{armed: map[string]bool{}}
		e := startEnv(t, base.rdb, grpc.WithChainUnaryInterceptor(dr.intercept))

		// lost sends call once with its answer lost, and returns call, to be
		// sent again later.
		lost := func(method string, call func() error) func() error {
			t.Helper()
			dr.arm(method)
			if err := call(); status.Code(err) != codes.Unavailable {
				t.Fatalf("%s = %v, want the lost response", method, err)
			}
			return call
		}

		for _, tc := range []struct {
			name   string
			fault  fault
			report func(id string, token uint64) func() error
		}{
			{"Complete(FAILED_RETRYABLE)", failBeforeWrite, func(id string, token uint64) func() error {
				return lost("Complete", func() error {
					_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: token,
						Outcome: outRetryable, Failure: &ledgerv1.Failure{Code: "503"}})
					return err
				})
			}},
			{"MarkUnknown", timeoutNoWrite, func(id string, token uint64) func() error {
				call := lost("MarkUnknown", func() error {
					_, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: token, Reason: "timeout"})
					return err
				})
				// A reconciler finds nothing at the destination.
				if _, err := e.reconcileAs(t, id, notApplied); err != nil {
					t.Fatal(err)
				}
				return call
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				d := newDestination(tc.fault)
				id := e.id(tc.name)
				first := e.claim(t, id, "payments.refund", 0)
				if _, err := d.apply(id, "42"); err == nil {
					t.Fatal("the destination accepted the first request")
				}
				again := tc.report(id, first.FencingToken)
				if st := e.lookup(t, id).State; st != pending {
					t.Fatalf("state %v after attempt 1's report, want PENDING", st)
				}

				// Attempt 2 claims the operation.
				second := e.claim(t, id, "payments.refund", 0)
				if second.Attempt != 2 {
					t.Fatalf("attempt %d, want 2", second.Attempt)
				}
				before := e.lookup(t, id)
				// Attempt 1's report arrives again.
				if err := again(); err != nil {
					t.Fatalf("the repeat of attempt 1's report: %v, want OK (it took effect)", err)
				}
				e.wantUnchanged(t, id, before)

				// Attempt 2 applies the effect and records it; every later
				// call replays it.
				rid, err := d.apply(id, "42")
				if err != nil {
					t.Fatal(err)
				}
				e.complete(t, id, second.FencingToken, outSucceeded, rid)
				if err := again(); err != nil {
					t.Fatalf("the repeat after attempt 2 succeeded: %v", err)
				}
				if got, err := e.perform(t, d, id, "payments.refund", map[string]any{"amount": 42}); err != nil || got != rid {
					t.Fatalf("retry = %q, %v; want the replayed %q", got, err, rid)
				}
				if op := e.lookup(t, id); op.State != succeeded || op.Result.GetResourceId() != rid {
					t.Fatalf("record = %v", op)
				}
				if n := d.count(id); n != 1 {
					t.Fatalf("the destination applied the effect %d times, want 1", n)
				}
			})
		}
	})
}

// TestReconcileCarriesHistory: the operation in Reconcile's response carries
// its history, the same as Lookup's right after, so a reconciler sees what
// its finding recorded without another call.
func TestReconcileCarriesHistory(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		id := e.id("refund")
		res, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", nil, newHolder()))
		if err != nil || res.GetDecision() != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("Reserve = %v, %v", res, err)
		}
		tok := res.GetOperation().GetFencingToken()
		if _, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: tok, Reason: "timeout"}); err != nil {
			t.Fatal(err)
		}
		rec, err := e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_ESCALATE,
			Note: "finance must check", FencingToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		h := rec.GetOperation().GetHistory()
		if len(h) != 3 {
			t.Fatalf("Reconcile's history has %d entries, want 3: %v", len(h), h)
		}
		if last := h[2]; last.GetReason() != "ESCALATED" || last.GetDetail() != "finance must check" || last.GetFencingToken() != tok ||
			last.GetFromState() != ledgerv1.State_STATE_UNKNOWN || last.GetToState() != ledgerv1.State_STATE_UNKNOWN {
			t.Errorf("latest entry = %v", last)
		}
		look, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: id})
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(rec.GetOperation(), look.GetOperation()) {
			t.Errorf("Reconcile's operation\n%v\ndiffers from Lookup's\n%v", rec.GetOperation(), look.GetOperation())
		}
	})
}

const (
	applied    = ledgerv1.Finding_FINDING_APPLIED
	notApplied = ledgerv1.Finding_FINDING_NOT_APPLIED
	abandon    = ledgerv1.Finding_FINDING_ABANDON
	escalate   = ledgerv1.Finding_FINDING_ESCALATE
)

// reconcileAs records finding f about id with a note, a result (APPLIED) or
// a failure (ABANDON), and returns the operation in the response.
func (e *env) reconcileAs(t *testing.T, id string, f ledgerv1.Finding) (*ledgerv1.Operation, error) {
	t.Helper()
	req := &ledgerv1.ReconcileRequest{OperationId: id, Finding: f, Note: "checked the destination"}
	switch f {
	case applied:
		req.Result = &ledgerv1.Result{ResourceId: "R-found", Data: mustStruct(t, map[string]any{"receipt": "R-found"})}
	case abandon:
		req.Failure = &ledgerv1.Failure{Code: "gave_up", Message: "nothing at the destination"}
	}
	res, err := e.c.Reconcile(e.ctx, req)
	return res.GetOperation(), err
}

// waitState waits until Lookup shows id in state st.
func (e *env) waitState(t *testing.T, id string, st ledgerv1.State) *ledgerv1.Operation {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		op := e.lookup(t, id)
		if op.State == st {
			return op
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed %v, want %v", id, op.State, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The names of the wire's enums in these tests. The state machine, row by
// row and rule by rule, is tested in ledger/; the scenarios above cover the
// paths an agent takes over the wire.
const (
	execute   = ledgerv1.Decision_DECISION_EXECUTE
	replay    = ledgerv1.Decision_DECISION_REPLAY
	inProg    = ledgerv1.Decision_DECISION_IN_PROGRESS
	reconcile = ledgerv1.Decision_DECISION_RECONCILE

	pending   = ledgerv1.State_STATE_PENDING
	running   = ledgerv1.State_STATE_RUNNING
	succeeded = ledgerv1.State_STATE_SUCCEEDED
	failed    = ledgerv1.State_STATE_FAILED_FINAL
	unknown   = ledgerv1.State_STATE_UNKNOWN

	irreversible = ledgerv1.Effect_EFFECT_IRREVERSIBLE
	idempotent   = ledgerv1.Effect_EFFECT_IDEMPOTENT
	readOnly     = ledgerv1.Effect_EFFECT_READ_ONLY

	outSucceeded = ledgerv1.Outcome_OUTCOME_SUCCEEDED
	outFailed    = ledgerv1.Outcome_OUTCOME_FAILED_FINAL
	outRetryable = ledgerv1.Outcome_OUTCOME_FAILED_RETRYABLE
)

// reserveAs reserves id for tool with effect (the policy's when
// unspecified) and fixed parameters, and fails the test on an error.
func (e *env) reserveAs(t *testing.T, id, tool string, effect ledgerv1.Effect, holder string) *ledgerv1.ReserveResponse {
	t.Helper()
	req := reserveReq(id, tool, mustStruct(t, map[string]any{"amount": 42}), holder)
	req.Effect = effect
	res, err := e.c.Reserve(e.ctx, req)
	if err != nil {
		t.Fatalf("Reserve(%s): %v", id, err)
	}
	return res
}

// claim reserves a new operation and checks it is EXECUTE.
func (e *env) claim(t *testing.T, id, tool string, effect ledgerv1.Effect) *ledgerv1.Operation {
	t.Helper()
	res := e.reserveAs(t, id, tool, effect, newHolder())
	if res.Decision != execute {
		t.Fatalf("Reserve(%s) = %v, want EXECUTE", id, res.Decision)
	}
	return res.Operation
}

func (e *env) complete(t *testing.T, id string, token uint64, outcome ledgerv1.Outcome, rid string) *ledgerv1.Operation {
	t.Helper()
	req := &ledgerv1.CompleteRequest{OperationId: id, FencingToken: token, Outcome: outcome}
	if outcome == outSucceeded {
		req.Result = &ledgerv1.Result{ResourceId: rid, Data: mustStruct(t, map[string]any{"receipt": rid})}
	} else {
		req.Failure = &ledgerv1.Failure{Code: rid, Message: "refused by the destination"}
	}
	res, err := e.c.Complete(e.ctx, req)
	if err != nil {
		t.Fatalf("Complete(%s, %v): %v", id, outcome, err)
	}
	return res.Operation
}

func (e *env) markUnknown(t *testing.T, id string, token uint64) *ledgerv1.Operation {
	t.Helper()
	res, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: token, Reason: "timeout"})
	if err != nil {
		t.Fatalf("MarkUnknown(%s): %v", id, err)
	}
	return res.Operation
}

// waitLeaseEnd waits until the store's clock is past the lease of op.
func (e *env) waitLeaseEnd(t *testing.T, op *ledgerv1.Operation) {
	t.Helper()
	end := op.GetLeaseExpiresAt().AsTime()
	for {
		now, err := e.rdb.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.After(end) {
			return
		}
		time.Sleep(end.Sub(now) + 5*time.Millisecond)
	}
}

// wantUnchanged fails unless id's record is as before.
func (e *env) wantUnchanged(t *testing.T, id string, before *ledgerv1.Operation) {
	t.Helper()
	if after := e.lookup(t, id); !proto.Equal(before, after) {
		t.Fatalf("the record changed:\nbefore %v\nafter  %v", before, after)
	}
}

// TestKeyReusedNamesWhatDiffers: IDEMPOTENCY_KEY_REUSED names every one of
// tool, params and permit that differs, in that order, never a value, in any
// state of the record, and leaves the record as it was.
func TestKeyReusedNamesWhatDiffers(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		const tool, permit = "payments.refund", "permit-1"
		bound := map[string]any{"amount": 42}
		states := map[string]func(id string){
			"RUNNING": func(id string) { e.claim(t, id, tool, 0) },
			"PENDING": func(id string) {
				e.complete(t, id, e.claim(t, id, tool, 0).FencingToken, outRetryable, "503")
			},
			"UNKNOWN": func(id string) { e.markUnknown(t, id, e.claim(t, id, tool, 0).FencingToken) },
			"SUCCEEDED": func(id string) {
				e.complete(t, id, e.claim(t, id, tool, 0).FencingToken, outSucceeded, "R-1")
			},
			"FAILED_FINAL": func(id string) {
				e.complete(t, id, e.claim(t, id, tool, 0).FencingToken, outFailed, "declined")
			},
		}
		for name, setup := range states {
			id := e.id(name)
			setup(id)
			before := e.lookup(t, id)
			for _, tc := range []struct {
				tool, permit string
				params       map[string]any
				differs      string
			}{
				{"payments.payout", permit, bound, "tool"},
				{tool, permit, map[string]any{"amount": 4242}, "params"},
				{tool, "permit-secret-2", bound, "permit"},
				{"payments.payout", permit, map[string]any{"amount": 4242}, "tool,params"},
				{"payments.payout", "permit-secret-2", bound, "tool,permit"},
				{tool, "permit-secret-2", map[string]any{"amount": 4242}, "params,permit"},
				{"payments.payout", "permit-secret-2", map[string]any{"amount": 4242}, "tool,params,permit"},
			} {
				req := reserveReq(id, tc.tool, mustStruct(t, tc.params), newHolder())
				req.PermitId = tc.permit
				_, err := e.c.Reserve(e.ctx, req)
				ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
				if ei.Metadata["differs"] != tc.differs {
					t.Errorf("%s: differs = %q, want %q", name, ei.Metadata["differs"], tc.differs)
				}
				text := status.Convert(err).Message()
				for _, v := range ei.Metadata {
					text += " " + v
				}
				for _, value := range []string{"payout", "4242", "secret", "permit-1"} {
					if strings.Contains(text, value) {
						t.Errorf("%s: the error names the value %q: %s", name, value, text)
					}
				}
			}
			e.wantUnchanged(t, id, before)
		}
	})
}

// TestIDsWithAnyCharacterKeepToTheirTenant: tenants and operation ids made
// of braces, colons, percent escapes and non-ASCII text go through every
// step of an operation's life over the wire (Reserve, the sweeper's lease
// expiry, ListUnresolved, Reconcile, the replay) on a real redis-server, a
// Redis Cluster and the embedded engine. Tenant "t" with id "u:v" and tenant
// "t:u" with id "v" join to the same text; each operation must stay its own
// tenant's, and each effect must be applied once.
func TestIDsWithAnyCharacterKeepToTheirTenant(t *testing.T) {
	run := randomHex(4)
	tenants := map[string][]string{ // tenant -> its operation ids
		"t-" + run:           {"u:v", "{s07}", "a}{b", "%41", "x y"},
		"t-" + run + ":u":    {"v", "%2541", "ünï→code:{}"},
		"{s01}-" + run + ":": {"u:v", "*", "}{"},
	}
	// Credentials: a reconciler key per tenant.
	doc := map[string]any{}
	var keys []map[string]any
	secrets := map[string]string{} // tenant -> API key
	i := 0
	for tenant := range tenants {
		i++
		id := "k" + string(rune('0'+i))
		key, hash, err := server.NewAPIKey(id)
		if err != nil {
			t.Fatal(err)
		}
		secrets[tenant] = key
		keys = append(keys, map[string]any{"id": id, "tenant": tenant, "scopes": []string{"reconciler"}, "secret_sha256": hash})
	}
	doc["keys"] = keys
	raw, _ := json.Marshal(doc)
	creds, err := server.ParseCredentials(raw)
	if err != nil {
		t.Fatal(err)
	}

	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := startSweeping(t, rdb, creds)
		d := newDestination()
		key := func(tenant, id string) string { return tenant + "\x00" + id }
		reserve := func(tenant, id string) *ledgerv1.ReserveResponse {
			t.Helper()
			res, err := c.Reserve(as(secrets[tenant]), reserveReq(id, "expiring.refund", mustStruct(t, map[string]any{"amount": 5}), newHolder()))
			if err != nil {
				t.Fatalf("Reserve(%q, %q): %v", tenant, id, err)
			}
			return res
		}

		// Every operation is claimed and applied; its worker dies.
		for tenant, ids := range tenants {
			for _, id := range ids {
				if res := reserve(tenant, id); res.Decision != ledgerv1.Decision_DECISION_EXECUTE {
					t.Fatalf("Reserve(%q, %q) = %v, want EXECUTE", tenant, id, res.Decision)
				}
				if _, err := d.apply(key(tenant, id), "5"); err != nil {
					t.Fatal(err)
				}
			}
		}

		// The sweeper makes each one UNKNOWN, and each tenant lists exactly
		// its own operations, under their ids as sent.
		for tenant, ids := range tenants {
			want := slices.Sorted(slices.Values(ids))
			var got []string
			deadline := time.Now().Add(10 * time.Second)
			for {
				list, err := c.ListUnresolved(as(secrets[tenant]), &ledgerv1.ListUnresolvedRequest{States: []ledgerv1.State{ledgerv1.State_STATE_UNKNOWN}})
				if err != nil {
					t.Fatal(err)
				}
				got = got[:0]
				for _, o := range list.Operations {
					got = append(got, o.OperationId)
				}
				slices.Sort(got)
				if slices.Equal(got, want) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("tenant %q lists UNKNOWN %q, want %q", tenant, got, want)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}

		// Tenant "t" has no operation "v"; tenant "t:u" has one.
		_, err := c.Lookup(as(secrets["t-"+run]), &ledgerv1.LookupRequest{OperationId: "v"})
		wantReason(t, err, codes.NotFound, "NOT_FOUND")

		// Each is reconciled from its own destination record, and replays it.
		for tenant, ids := range tenants {
			for _, id := range ids {
				rid, ok := d.find(key(tenant, id))
				if !ok {
					t.Fatalf("no effect for (%q, %q)", tenant, id)
				}
				rec, err := c.Reconcile(as(secrets[tenant]), &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_APPLIED,
					Result: &ledgerv1.Result{ResourceId: rid}})
				if err != nil || rec.Operation.State != ledgerv1.State_STATE_SUCCEEDED {
					t.Fatalf("Reconcile(%q, %q) = %v, %v", tenant, id, rec, err)
				}
			}
		}
		for tenant, ids := range tenants {
			list, err := c.ListUnresolved(as(secrets[tenant]), &ledgerv1.ListUnresolvedRequest{})
			if err != nil || len(list.Operations) != 0 {
				t.Fatalf("tenant %q still lists %v (%v)", tenant, list.GetOperations(), err)
			}
			for _, id := range ids {
				res := reserve(tenant, id)
				want, _ := d.find(key(tenant, id))
				if res.Decision != ledgerv1.Decision_DECISION_REPLAY || res.Operation.Result.GetResourceId() != want || res.Operation.OperationId != id {
					t.Fatalf("Reserve(%q, %q) again = %v %q, want REPLAY of %q", tenant, id, res.Decision, res.Operation.Result.GetResourceId(), want)
				}
				if n := d.count(key(tenant, id)); n != 1 {
					t.Fatalf("(%q, %q) applied %d times, want 1", tenant, id, n)
				}
			}
		}
	})
}

// startSweeping serves a ledger with authentication and its sweeper running,
// and returns a client of it.
func startSweeping(t *testing.T, rdb redis.UniversalClient, creds *server.Credentials) ledgerv1.LedgerServiceClient {
	t.Helper()
	pol, err := ledger.ParsePolicies([]byte(ledgertest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(&ledgertest.Buffer{}, nil))
	l, err := ledger.New(rdb, ledger.Options{Policies: pol, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(server.Config{Ledger: l, Logger: log, Auth: server.NewAuthenticator(creds)})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.RunSweeper(ctx, 50*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done; svc.GRPC.Stop() })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return ledgerv1.NewLedgerServiceClient(conn)
}
