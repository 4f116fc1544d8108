package faults

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/opledger/ledger/fingerprint"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// recorder records every ledger call its clients make (a gRPC client
// interceptor): the history porcupine checks, and the acknowledged writes a
// crash must not lose.
type recorder struct {
	effect int    // the effect operations are bound to (the policy's)
	max    uint32 // the policy's max attempts
	// answers makes every successful answer that shows the record an
	// acknowledgement of what it shows (a Lookup, a Renew, a Reserve of any
	// decision), not only those of writes: what a ledger with WaitReplicas
	// promises, since it answers only once the replicas have the state the
	// call read.
	answers bool

	mu      sync.Mutex
	base    time.Time
	ops     []porcupine.Operation
	acks    []ack
	clients int
}

// callerPrincipal is the principal the ledger records for every call the
// recorder sees: the fault tests' ledgers run without authentication, so
// each caller is the server's anonymous principal.
const callerPrincipal = "anonymous"

// ack is a write the client got a successful answer for.
type ack struct {
	Kind    kind
	ID      string
	Outcome int // Complete
	Finding int // Reconcile
	// The record the answer showed.
	State   int
	Attempt uint32
	Token   uint64
	RID     string
	Reason  string
}

func newRecorder(effect int, maxAttempts uint32) *recorder {
	return &recorder{effect: effect, max: maxAttempts, base: time.Now()}
}

func (r *recorder) now() int64 { return int64(time.Since(r.base)) }

// interceptor returns the interceptor of one client (its porcupine client
// id is for the visualization only).
func (r *recorder) interceptor() grpc.UnaryClientInterceptor {
	r.mu.Lock()
	id := r.clients
	r.clients++
	r.mu.Unlock()
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		in, ok := r.input(req)
		if !ok {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		call := r.now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		ret := r.now()
		out := outputOf(reply, err)
		r.mu.Lock()
		r.ops = append(r.ops, porcupine.Operation{ClientId: id, Input: in, Call: call, Output: out, Return: ret})
		if !out.Unknown && out.Err == "" && (r.answers && out.HasOp ||
			in.Kind != kLookup && in.Kind != kRenew && (in.Kind != kReserve || out.Decision == decExecute)) {
			r.acks = append(r.acks, ack{Kind: in.Kind, ID: in.ID, Outcome: in.Outcome, Finding: in.Finding,
				State: out.State, Attempt: out.Attempt, Token: out.Token, RID: out.RID, Reason: out.Reason})
		}
		r.mu.Unlock()
		return err
	}
}

// input describes a request (false for calls the model does not cover).
func (r *recorder) input(req any) (input, bool) {
	switch q := req.(type) {
	case *ledgerv1.ReserveRequest:
		eff := int(q.GetEffect())
		if eff == 0 {
			eff = r.effect
		}
		return input{Kind: kReserve, ID: q.GetOperationId(), Holder: q.GetHolder(), Effect: eff, Max: r.max}, true
	case *ledgerv1.CompleteRequest:
		in := input{Kind: kComplete, ID: q.GetOperationId(), Token: q.GetFencingToken(), Outcome: int(q.GetOutcome()),
			RID: q.GetResult().GetResourceId(), Data: canonicalData(q.GetResult()), Code: q.GetFailure().GetCode(), Msg: q.GetFailure().GetMessage()}
		in.Digest = fmt.Sprintf("%d|%q|%q|%q|%s", in.Outcome, in.RID, in.Code, in.Msg, in.Data)
		return in, true
	case *ledgerv1.MarkUnknownRequest:
		return input{Kind: kMarkUnknown, ID: q.GetOperationId(), Token: q.GetFencingToken()}, true
	case *ledgerv1.RenewRequest:
		return input{Kind: kRenew, ID: q.GetOperationId(), Token: q.GetFencingToken()}, true
	case *ledgerv1.ReconcileRequest:
		return input{Kind: kReconcile, ID: q.GetOperationId(), Finding: int(q.GetFinding()), Token: q.GetFencingToken(),
			RID: q.GetResult().GetResourceId(), Data: canonicalData(q.GetResult()), Code: q.GetFailure().GetCode(),
			Msg: q.GetFailure().GetMessage(), Principal: callerPrincipal, Note: q.GetNote()}, true
	case *ledgerv1.LookupRequest:
		return input{Kind: kLookup, ID: q.GetOperationId()}, true
	}
	return input{}, false
}

// canonicalData is a result's data as the ledger stores it: canonical JSON
// ("" for none).
func canonicalData(r *ledgerv1.Result) string {
	d := r.GetData()
	if d == nil {
		return ""
	}
	b, err := fingerprint.Canonical(d.AsMap())
	if err != nil {
		panic(err)
	}
	return string(b)
}

// outputOf describes an answer. A definite refusal (FAILED_PRECONDITION,
// NOT_FOUND, INVALID_ARGUMENT: the script ran and changed nothing, or the
// call never reached it) has its reason; anything else that failed may or
// may not have taken effect.
func outputOf(reply any, err error) output {
	if err != nil {
		st := status.Convert(err)
		switch st.Code() {
		case codes.FailedPrecondition, codes.NotFound, codes.InvalidArgument:
			reason := st.Code().String()
			for _, d := range st.Details() {
				if ei, ok := d.(*errdetails.ErrorInfo); ok {
					reason = ei.GetReason()
				}
			}
			return output{Err: reason}
		}
		why := st.Code().String()
		for _, d := range st.Details() {
			if ei, ok := d.(*errdetails.ErrorInfo); ok {
				why = ei.GetReason()
			}
		}
		return output{Unknown: true, Why: why}
	}
	var o output
	var op *ledgerv1.Operation
	switch a := reply.(type) {
	case *ledgerv1.ReserveResponse:
		o.Decision, op = int(a.GetDecision()), a.GetOperation()
	case *ledgerv1.CompleteResponse:
		op = a.GetOperation()
	case *ledgerv1.MarkUnknownResponse:
		op = a.GetOperation()
	case *ledgerv1.RenewResponse:
		op = a.GetOperation()
	case *ledgerv1.ReconcileResponse:
		op = a.GetOperation()
	case *ledgerv1.LookupResponse:
		op = a.GetOperation()
	}
	if op != nil {
		o.HasOp = true
		o.State, o.Attempt, o.Token = int(op.GetState()), op.GetAttempt(), op.GetFencingToken()
		o.Reason = op.GetReason()
		if o.State == stSucceeded {
			o.RID = op.GetResult().GetResourceId()
		}
	}
	return o
}

// history returns the recorded calls; those that ended without telling
// whether they took effect return at the end of the history. With resent,
// every write call with a definite answer also gets a twin with an unknown
// outcome within its own interval: go-redis may have run its script once
// before the run that answered (a reply lost to a timeout or a reset, the
// same EVALSHA sent again), and that earlier run's effect stands even when
// the answering run, finding the record changed meanwhile, refuses.
func (r *recorder) history(resent bool) []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	end := r.now()
	h := make([]porcupine.Operation, 0, len(r.ops))
	for _, op := range r.ops {
		out := op.Output.(output)
		if out.Unknown {
			op.Return = end
		} else if resent && op.Input.(input).Kind != kLookup {
			twin := op
			twin.Output = output{Unknown: true}
			h = append(h, twin)
		}
		h = append(h, op)
	}
	return h
}

// acknowledged returns the writes acknowledged so far.
func (r *recorder) acknowledged() []ack {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ack(nil), r.acks...)
}

// unknownWhy returns how many calls ended with an unknown outcome, by the
// reason (ErrorInfo) or code of their error.
func (r *recorder) unknownWhy() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, op := range r.ops {
		if o := op.Output.(output); o.Unknown {
			out[o.Why]++
		}
	}
	return out
}

// counts returns how many calls of each kind were made, and how many
// ended with an unknown outcome.
func (r *recorder) counts() (calls map[string]int, unknown int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	calls = map[string]int{}
	for _, op := range r.ops {
		calls[kindNames[op.Input.(input).Kind]]++
		if op.Output.(output).Unknown {
			unknown++
		}
	}
	return calls, unknown
}

// linearizable checks the recorded history with porcupine, one operation
// id at a time, and fails the test for every violation, writing the
// visualization of the first to a temporary file. With resent, the history
// allows each write call a second run of its script (see history); the
// operations that are linearizable only with it are counted and the first
// one is logged.
//
// It returns how many operations needed a second run of a script.
func (r *recorder) linearizable(t *testing.T, resent bool) int {
	t.Helper()
	_, twice := r.checkLinearizable(t, resent, true)
	return twice
}

// violations counts the operations whose history is not linearizable,
// logging the first, without failing the test (for measurements).
func (r *recorder) violations(t *testing.T, resent bool) int {
	t.Helper()
	bad, _ := r.checkLinearizable(t, resent, false)
	return bad
}

func (r *recorder) checkLinearizable(t *testing.T, resent, failing bool) (violations, twice int) {
	t.Helper()
	fail := t.Logf
	if failing {
		fail = t.Errorf
	}
	m := model()
	single := m
	single.Partition = nil
	check := func(h []porcupine.Operation, report bool) (int, map[string]bool) {
		bad := map[string]bool{}
		for _, p := range m.Partition(h) {
			res, info := porcupine.CheckOperationsVerbose(single, p, 2*time.Minute)
			if res == porcupine.Ok {
				continue
			}
			id := p[0].Input.(input).ID
			bad[id] = true
			if !report {
				continue
			}
			if len(bad) == 1 {
				msg := fmt.Sprintf("porcupine: operation %s: %s", id, res)
				if failing { // a measurement's expected violations leave no file
					if f, err := os.CreateTemp("", "ledger-porcupine-*.html"); err == nil {
						_ = porcupine.Visualize(single, info, f)
						_ = f.Close()
						msg += "; visualization: " + f.Name()
					}
				}
				fail("%s; its calls:\n%s", msg, describeAll(p))
			} else if len(bad) <= 10 {
				fail("porcupine: operation %s: %s", id, res)
			}
		}
		return len(m.Partition(h)), bad
	}
	h := r.history(resent)
	ops, bad := check(h, true)
	t.Logf("linearizability (porcupine): %d operations, %d calls, %d violations", ops, len(r.history(false)), len(bad))
	if !resent || len(bad) > 0 {
		return len(bad), 0
	}
	strict := r.history(false)
	_, only := check(strict, false)
	if len(only) == 0 {
		t.Logf("linearizability: every operation is linearizable without counting re-sent scripts too")
		return 0, 0
	}
	var first string
	for id := range only {
		if first == "" || id < first {
			first = id
		}
	}
	var calls []porcupine.Operation
	for _, op := range strict {
		if op.Input.(input).ID == first {
			calls = append(calls, op)
		}
	}
	t.Logf("linearizability: %d operations are linearizable only when a call's script may have run once more before the run that answered (a go-redis re-send); e.g. %s:\n%s",
		len(only), first, describeAll(calls))
	return 0, len(only)
}

func describeAll(p []porcupine.Operation) string {
	var b strings.Builder
	for _, op := range p {
		fmt.Fprintf(&b, "  [%8.3fms, %8.3fms] c%d %s\n", float64(op.Call)/1e6, float64(op.Return)/1e6, op.ClientId, describe(op.Input, op.Output))
	}
	return b.String()
}
