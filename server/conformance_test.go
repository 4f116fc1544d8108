package server_test

// The conformance scenarios of contract.md §9 (S1–S7, S9–S13; S8 is in
// security_test.go), end to end over gRPC against a real redis-server and
// the embedded engine. Each one counts how many times the fake destination
// applied the effect.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
)

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
		res, err := e.c.Reserve(e.ctx, reserveReq(id, "short.refund", params, newHolder()))
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
		res, err = e.c.Reserve(e.ctx, reserveReq(id, "short.refund", params, newHolder()))
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
		got, err := e.perform(t, d, id, "short.refund", map[string]any{"amount": 42})
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
			rid, err := e.perform(t, d, id, "tiny.refund", params)
			if err != nil {
				t.Fatal(err)
			}
			// tiny.* records live 1 s, then their tombstone 1 h.
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
				got, err := e.perform(t, d, id, "tiny.refund", params)
				if ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_EXPIRED"); ei.Metadata["final_state"] != "STATE_SUCCEEDED" || got != "" {
					t.Fatalf("late replay = %q, %v", got, ei.Metadata)
				}
				// Other parameters under the expired key are no late replay:
				// the tombstone keeps the fingerprint, and the old outcome
				// is not theirs (S4).
				got, err = e.perform(t, d, id, "tiny.refund", map[string]any{"amount": 4200})
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
		slot := map[string]any{"patient": "p-17", "clinic": "c-2", "start": "2026-12-03T09:30:00Z"}

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
		other := map[string]any{"patient": "p-17", "clinic": "c-2", "start": "2026-12-04T09:30:00Z"}
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
		// No parameter value or result reached the logs.
		logs := e.logs.String()
		for _, secret := range []string{"p-17", "c-2", "2026-12-03", "receipt", got[0]} {
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
		a, err := e.c.Reserve(e.ctx, reserveReq(id, "short.idempotent", params, newHolder()))
		if err != nil || a.Decision != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("worker A = %v, %v", a, err)
		}
		// Worker A stalls past its lease; worker B takes over.
		e.waitLeaseEnd(t, a.Operation)
		b, err := e.c.Reserve(e.ctx, reserveReq(id, "short.idempotent", params, newHolder()))
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
