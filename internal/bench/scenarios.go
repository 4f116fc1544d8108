package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/opledger/ledger/fingerprint"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// ResultBytes is the size of the result data every benchmark cycle records,
// as the canonical JSON the ledger stores.
const ResultBytes = 100

// Target is a ledger service under load, reached over Conns HTTP/2
// connections (ghz's default is one).
type Target struct {
	conns  []*grpc.ClientConn
	ledger []ledgerv1.LedgerServiceClient
	health []healthpb.HealthClient
	next   atomic.Uint64

	params *structpb.Struct
	result *ledgerv1.Result
}

// Dial connects to the service at addr over conns connections.
func Dial(addr string, conns int) (*Target, error) {
	if conns < 1 {
		conns = 1
	}
	t := &Target{}
	for range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Close()
			return nil, err
		}
		t.conns = append(t.conns, c)
		t.ledger = append(t.ledger, ledgerv1.NewLedgerServiceClient(c))
		t.health = append(t.health, healthpb.NewHealthClient(c))
	}
	var err error
	t.params, err = structpb.NewStruct(refundParams)
	if err != nil {
		return nil, err
	}
	// {"id":"…"} with the padding that makes it ResultBytes long.
	data, err := structpb.NewStruct(map[string]any{"id": strings.Repeat("r", ResultBytes-len(`{"id":""}`))})
	if err != nil {
		return nil, err
	}
	t.result = &ledgerv1.Result{Data: data}
	return t, nil
}

// refundParams are a refund's consequential parameters: what a real agent
// would send, in every Reserve of the benchmark.
var refundParams = map[string]any{
	"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250, "currency": "eur", "reason": "requested_by_customer",
}

// holder is the holder of the seq-th Reserve of a phase.
func holder(seq int64) string { return fmt.Sprintf("h-%032x", seq) }

// Close closes the connections.
func (t *Target) Close() {
	for _, c := range t.conns {
		_ = c.Close()
	}
}

func (t *Target) pick() int {
	if len(t.conns) == 1 {
		return 0
	}
	return int(t.next.Add(1) % uint64(len(t.conns)))
}

// RunID returns a short random prefix, so the ids of two runs against one
// store never meet.
func RunID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// OperationID is the id of the seq-th operation of a phase: shaped like a
// workflow run and step ("wf-<run><seq>:refund"), 24 bytes for the default
// prefixes.
func OperationID(prefix string, seq int64) string {
	return fmt.Sprintf("wf-%s%07d:refund", prefix, seq)
}

// runOf is the id of a phase's n-th run.
func runOf(prefix string, n int64) string {
	return fmt.Sprintf("run-%s%07d", prefix, n)
}

// Health is one grpc.health.v1.Health/Check: the transport baseline.
func (t *Target) Health() Call {
	return func(ctx context.Context, _ int64) error {
		i := t.pick()
		res, err := t.health[i].Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			err = fmt.Errorf("health: %v", res.GetStatus())
		}
		return err
	}
}

func (t *Target) reserveRequest(id string, seq int64) *ledgerv1.ReserveRequest {
	return &ledgerv1.ReserveRequest{
		OperationId: id, Tool: "payments.refund", Params: t.params,
		PermitId: "approval-77", Holder: holder(seq),
	}
}

func (t *Target) reserve(ctx context.Context, id string, seq int64, want ledgerv1.Decision) (*ledgerv1.ReserveResponse, error) {
	return t.send(ctx, t.reserveRequest(id, seq), want)
}

// send sends a Reserve and checks its decision.
func (t *Target) send(ctx context.Context, req *ledgerv1.ReserveRequest, want ledgerv1.Decision) (*ledgerv1.ReserveResponse, error) {
	res, err := t.ledger[t.pick()].Reserve(ctx, req)
	if err == nil && res.GetDecision() != want {
		err = fmt.Errorf("Reserve(%s) = %v, want %v", req.GetOperationId(), res.GetDecision(), want)
	}
	return res, err
}

// ReserveNew reserves a new operation per call (DECISION_EXECUTE).
func (t *Target) ReserveNew(prefix string) Call {
	return func(ctx context.Context, seq int64) error {
		_, err := t.reserve(ctx, OperationID(prefix, seq), seq, ledgerv1.Decision_DECISION_EXECUTE)
		return err
	}
}

// ReserveNewFingerprint is ReserveNew from a client that computes the
// fingerprint of the parameters itself, on every call, and sends it as
// params_sha256 instead of the parameters.
func (t *Target) ReserveNewFingerprint(prefix string) Call {
	return func(ctx context.Context, seq int64) error {
		fp, err := fingerprint.Compute(refundParams, nil)
		if err != nil {
			return err
		}
		req := t.reserveRequest(OperationID(prefix, seq), seq)
		req.Params, req.ParamsSha256 = nil, fp[:]
		_, err = t.send(ctx, req, ledgerv1.Decision_DECISION_EXECUTE)
		return err
	}
}

// Cycle reserves a new operation and completes it as SUCCEEDED with a
// ResultBytes result: the whole life of a successful tool call.
func (t *Target) Cycle(prefix string) Call {
	return t.cycle(prefix, 0)
}

// CycleInRuns is Cycle with each operation a step of a run of steps
// operations (run (seq-1)/steps), governed when the service's policy
// governs every run id (runsPolicy).
func (t *Target) CycleInRuns(prefix string, steps int64) Call {
	return t.cycle(prefix, steps)
}

// cycle is Cycle, with runs of steps operations when steps > 0.
func (t *Target) cycle(prefix string, steps int64) Call {
	return func(ctx context.Context, seq int64) error {
		id := OperationID(prefix, seq)
		req := t.reserveRequest(id, seq)
		if steps > 0 {
			req.RunId = runOf(prefix, (seq-1)/steps)
		}
		res, err := t.send(ctx, req, ledgerv1.Decision_DECISION_EXECUTE)
		if err != nil {
			return err
		}
		_, err = t.ledger[t.pick()].Complete(ctx, &ledgerv1.CompleteRequest{
			OperationId: id, FencingToken: res.GetOperation().GetFencingToken(),
			Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: t.result,
		})
		return err
	}
}

// Replay reserves again one of the n operations a Cycle with prefix
// completed (DECISION_REPLAY, with the recorded result).
func (t *Target) Replay(prefix string, n int64) Call {
	return func(ctx context.Context, seq int64) error {
		k := seq%n + 1
		res, err := t.reserve(ctx, OperationID(prefix, k), k, ledgerv1.Decision_DECISION_REPLAY)
		if err == nil && len(res.GetOperation().GetResult().GetData().GetFields()) != 1 {
			err = fmt.Errorf("replay of %s without its result", OperationID(prefix, k))
		}
		return err
	}
}

// Lookup reads one of the n operations a Cycle with prefix completed.
func (t *Target) Lookup(prefix string, n int64) Call {
	return func(ctx context.Context, seq int64) error {
		id := OperationID(prefix, seq%n+1)
		res, err := t.ledger[t.pick()].Lookup(ctx, &ledgerv1.LookupRequest{OperationId: id})
		if err == nil && (res.GetOperation().GetState() != ledgerv1.State_STATE_SUCCEEDED || len(res.GetOperation().GetHistory()) != 2) {
			err = fmt.Errorf("Lookup(%s) = %v with %d history entries", id, res.GetOperation().GetState(), len(res.GetOperation().GetHistory()))
		}
		return err
	}
}
