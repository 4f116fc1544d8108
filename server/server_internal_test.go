package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// BenchmarkHandleReserve measures the service's handling of one Reserve of
// a new operation without the transport: decoding the request from its
// wire bytes (the service's codec), the log fields, converting it, the
// ledger call (its script on a real redis-server), converting the answer
// and encoding the reply. Its allocations are the edge's on top of
// ledger's BenchmarkReserve:
//
//	go test -run '^$' -bench HandleReserve -benchmem ./server
func BenchmarkHandleReserve(b *testing.B) {
	h, codec := benchHandler(b)
	params, err := structpb.NewStruct(map[string]any{
		"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250, "currency": "eur", "reason": "requested_by_customer",
	})
	if err != nil {
		b.Fatal(err)
	}
	// One request's wire bytes; each call writes its own number into the
	// operation id, so that building requests allocates nothing.
	wire, err := proto.Marshal(&ledgerv1.ReserveRequest{
		OperationId: "wf-0000000000:refund", Tool: "payments.refund", Params: params,
		PermitId: "approval-77", Holder: "h-00000000000000000000000000000001",
	})
	if err != nil {
		b.Fatal(err)
	}
	digits := bytes.Index(wire, []byte("0000000000:refund"))
	ctx := context.WithValue(context.Background(), callLogKey{}, new(callLog))
	n := 0
	for b.Loop() {
		n++
		for i, v := digits+9, n; i >= digits; i, v = i-1, v/10 {
			wire[i] = byte('0' + v%10)
		}
		var req ledgerv1.ReserveRequest
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &req); err != nil {
			b.Fatal(err)
		}
		res, err := h.Reserve(ctx, &req)
		if err != nil {
			b.Fatal(err)
		}
		if res.GetDecision() != ledgerv1.Decision_DECISION_EXECUTE {
			b.Fatalf("decision %v", res.GetDecision())
		}
		out, err := codec.Marshal(res)
		if err != nil {
			b.Fatal(err)
		}
		out.Free()
	}
}

// BenchmarkHandleComplete measures the service's handling of one Complete
// (SUCCEEDED, a 100-byte result) of a claim reserved through the ledger
// outside the timed part: decoding the request from its wire bytes, the
// ledger call (its script on a real redis-server), converting the answer
// and encoding the reply:
//
//	go test -run '^$' -bench HandleComplete -benchmem ./server
func BenchmarkHandleComplete(b *testing.B) {
	h, codec := benchHandler(b)
	data, err := structpb.NewStruct(map[string]any{"id": strings.Repeat("r", 91)})
	if err != nil {
		b.Fatal(err)
	}
	params := map[string]any{"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250, "currency": "eur", "reason": "requested_by_customer"}
	ctx := context.WithValue(context.Background(), callLogKey{}, new(callLog))
	n := 0
	for b.Loop() {
		b.StopTimer()
		n++
		id := fmt.Sprintf("wf-%010d:refund", n)
		res, err := h.l.Reserve(ctx, h.anon, ledger.ReserveRequest{OperationID: id, Tool: "payments.refund", Params: params, PermitID: "approval-77"})
		if err != nil {
			b.Fatal(err)
		}
		wire, err := proto.Marshal(&ledgerv1.CompleteRequest{
			OperationId: id, FencingToken: res.Operation.FencingToken,
			Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{Data: data},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		var req ledgerv1.CompleteRequest
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &req); err != nil {
			b.Fatal(err)
		}
		out, err := h.Complete(ctx, &req)
		if err != nil {
			b.Fatal(err)
		}
		if out.GetOperation().GetState() != ledgerv1.State_STATE_SUCCEEDED {
			b.Fatalf("state %v", out.GetOperation().GetState())
		}
		enc, err := codec.Marshal(out)
		if err != nil {
			b.Fatal(err)
		}
		enc.Free()
	}
}

// benchHandler returns a handler on a ledger over a fresh redis-server, and
// the service's codec.
func benchHandler(b *testing.B) (*handler, *requestCodec) {
	l, err := ledger.New(redistest.Start(b).Client(b), ledger.Options{Policies: ledger.DefaultPolicies()})
	if err != nil {
		b.Fatal(err)
	}
	return &handler{l: l, anon: ledger.Principal{Tenant: DefaultTenant, ID: "anonymous"}}, newRequestCodec(DefaultMaxRequestBytes)
}

// fuzzStack is one embedded store and handler shared by a fuzzing process,
// with a victim tenant's operation the fuzzed calls must never touch.
type fuzzStack struct {
	m         *miniredis.Miniredis
	h         *handler
	victim    *ledgerv1.Operation
	victimRun *ledgerv1.Run
}

var (
	fuzzOnce sync.Once
	fuzzEnv  *fuzzStack
)

var (
	attacker = ledger.Principal{Tenant: "fuzz", ID: "fuzzer"}
	victim   = ledger.Principal{Tenant: "victim", ID: "v"}
)

func fuzzSetup(tb testing.TB) *fuzzStack {
	fuzzOnce.Do(func() {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			tb.Fatal(err)
		}
		l, err := ledger.New(redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true}), ledger.Options{})
		if err != nil {
			tb.Fatal(err)
		}
		h := &handler{l: l, log: slog.New(slog.NewTextHandler(io.Discard, nil)), anon: attacker}
		ctx := WithPrincipal(context.Background(), victim)
		if _, err := h.Reserve(ctx, &ledgerv1.ReserveRequest{OperationId: "op", Tool: "payments.refund", Holder: "h"}); err != nil {
			tb.Fatal(err)
		}
		look, err := h.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: "op"})
		if err != nil {
			tb.Fatal(err)
		}
		run, err := h.StartRun(ctx, &ledgerv1.StartRunRequest{RunId: "run", Limits: &ledgerv1.RunLimits{MaxSteps: 3}})
		if err != nil {
			tb.Fatal(err)
		}
		fuzzEnv = &fuzzStack{m: m, h: h, victim: look.Operation, victimRun: run.Run}
	})
	return fuzzEnv
}

// FuzzHandlers sends arbitrary requests (any method, any bytes that decode)
// as one tenant. Invariants: no panic; a request refused as INVALID_ARGUMENT
// writes nothing; nothing another tenant holds changes.
func FuzzHandlers(f *testing.F) {
	seed := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	f.Add(byte(0), seed(&ledgerv1.ReserveRequest{OperationId: "op", Tool: "payments.refund", Holder: "h"}))
	f.Add(byte(0), seed(&ledgerv1.ReserveRequest{OperationId: "{s01}:op\n", Tool: "t", ParamsSha256: make([]byte, 31)}))
	f.Add(byte(1), seed(&ledgerv1.CompleteRequest{OperationId: "op", FencingToken: 1, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED}))
	f.Add(byte(2), seed(&ledgerv1.MarkUnknownRequest{OperationId: "op", FencingToken: 1}))
	f.Add(byte(3), seed(&ledgerv1.LookupRequest{OperationId: "op"}))
	f.Add(byte(4), seed(&ledgerv1.ReconcileRequest{OperationId: "op", Finding: ledgerv1.Finding_FINDING_ABANDON}))
	f.Add(byte(5), seed(&ledgerv1.RenewRequest{OperationId: "op", FencingToken: 1}))
	f.Add(byte(6), seed(&ledgerv1.ListUnresolvedRequest{PageSize: 3, PageToken: "MDAwMDAwMDAwMDAwMDpvcA"}))
	f.Add(byte(7), seed(&ledgerv1.StartRunRequest{RunId: "run", Limits: &ledgerv1.RunLimits{MaxSteps: 1}}))
	f.Add(byte(8), seed(&ledgerv1.GetRunRequest{RunId: "run"}))
	f.Add(byte(9), seed(&ledgerv1.EndRunRequest{RunId: "run", State: ledgerv1.RunState_RUN_STATE_CANCELLED}))
	f.Add(byte(10), seed(&ledgerv1.ListRunsRequest{PageSize: 2}))
	f.Add(byte(0), seed(&ledgerv1.ReserveRequest{OperationId: "op-2", Tool: "t", RunId: "run"}))
	f.Fuzz(func(t *testing.T, method byte, data []byte) {
		s := fuzzSetup(t)
		ctx := WithPrincipal(context.Background(), attacker)
		before := s.m.Dump()
		var err error
		switch method % 11 {
		case 0:
			req := &ledgerv1.ReserveRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = s.h.Reserve(ctx, req)
		case 1:
			req := &ledgerv1.CompleteRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = s.h.Complete(ctx, req)
		case 2:
			req := &ledgerv1.MarkUnknownRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = s.h.MarkUnknown(ctx, req)
		case 3:
			req := &ledgerv1.LookupRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = s.h.Lookup(ctx, req)
		case 4:
			req := &ledgerv1.ReconcileRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = s.h.Reconcile(ctx, req)
		case 5:
			req := &ledgerv1.RenewRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = s.h.Renew(ctx, req)
		case 6:
			req := &ledgerv1.ListUnresolvedRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			var page *ledgerv1.ListUnresolvedResponse
			page, err = s.h.ListUnresolved(ctx, req)
			for _, o := range page.GetOperations() {
				if o.GetOperationId() == "op" && proto.Equal(o.GetCreatedAt(), s.victim.GetCreatedAt()) {
					t.Fatalf("the victim's operation was listed to another tenant")
				}
			}
		case 7:
			req := &ledgerv1.StartRunRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = s.h.StartRun(ctx, req)
		case 8:
			req := &ledgerv1.GetRunRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = s.h.GetRun(ctx, req)
		case 9:
			req := &ledgerv1.EndRunRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = s.h.EndRun(ctx, req)
		case 10:
			req := &ledgerv1.ListRunsRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			var page *ledgerv1.ListRunsResponse
			page, err = s.h.ListRuns(ctx, req)
			for _, r := range page.GetRuns() {
				if r.GetRunId() == "run" && proto.Equal(r.GetStartedAt(), s.victimRun.GetStartedAt()) {
					t.Fatalf("the victim's run was listed to another tenant")
				}
			}
		}
		if status.Code(err) == codes.InvalidArgument && s.m.Dump() != before {
			t.Fatalf("a refused request (%v) wrote to the store", err)
		}
		if status.Code(err) == codes.Internal {
			t.Fatalf("internal error: %v", err)
		}
		look, lerr := s.h.Lookup(WithPrincipal(context.Background(), victim), &ledgerv1.LookupRequest{OperationId: "op"})
		if lerr != nil || !proto.Equal(look.Operation, s.victim) {
			t.Fatalf("the victim's operation changed: %v (%v)", look.GetOperation(), lerr)
		}
		run, rerr := s.h.GetRun(WithPrincipal(context.Background(), victim), &ledgerv1.GetRunRequest{RunId: "run"})
		if rerr != nil || !proto.Equal(run.Run, s.victimRun) {
			t.Fatalf("the victim's run changed: %v (%v)", run.GetRun(), rerr)
		}
	})
}

// lockedBuffer is a log destination the server's goroutines write while
// the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Calls refused for missing or bad credentials write at most one call log
// line every refusalLogEvery, through the logger the server is given: each
// line counts the refused calls since the previous one that wrote none, and
// quotes no key material. Authenticated calls log as before, one line each.
func TestRefusedCallsLoggedAtMostEveryInterval(t *testing.T) {
	key, hash, err := NewAPIKey("log-agent")
	if err != nil {
		t.Fatal(err)
	}
	revoked, revokedHash, err := NewAPIKey("log-revoked")
	if err != nil {
		t.Fatal(err)
	}
	creds, err := ParseCredentials([]byte(fmt.Sprintf("keys:\n"+
		"  - {id: log-agent, tenant: acme, scopes: [agent], secret_sha256: %s}\n"+
		"  - {id: log-revoked, tenant: acme, scopes: [agent], secret_sha256: %s, disabled: true}\n", hash, revokedHash)))
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	l, err := ledger.New(redistest.Shared(t).Client(t), ledger.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	svc := New(Config{Ledger: l, Logger: log, Auth: NewAuthenticator(creds)})
	var at atomic.Int64 // the refusals' clock, in nanoseconds from start
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	svc.authRefusals.now = func() time.Time { return start.Add(time.Duration(at.Load())) }
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	t.Cleanup(svc.GRPC.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := ledgerv1.NewLedgerServiceClient(conn)

	_, revokedSecret, _ := strings.Cut(revoked, ".")
	_, keySecret, _ := strings.Cut(key, ".")
	wrongSecret := strings.Repeat("e", 64)
	headers := []string{
		"Bearer " + revoked,                // revoked: the first, logged
		"",                                 // no credentials
		"Bearer log-agent." + wrongSecret,  // a wrong secret
		"Bearer unknown-id." + wrongSecret, // an unknown id
		"Basic " + keySecret,               // not a bearer key
		"Bearer " + strings.ReplaceAll(key, ".", ""), // the key without its '.'
	}
	refused := func(header string) {
		t.Helper()
		ctx := context.Background()
		if header != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", header)
		}
		_, err := c.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: "refused-log"})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("Lookup with %q: %v, want UNAUTHENTICATED", header, err)
		}
	}
	const calls = 60
	for i := range calls {
		refused(headers[i%len(headers)])
	}
	// A refused stream (reflection needs credentials) counts with them.
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Send may see io.EOF when the server has already refused the stream;
	// Recv then returns the refusal.
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if _, err := rs.Recv(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("reflection without credentials: %v, want UNAUTHENTICATED", err)
	}
	// Authenticated calls are not held back.
	for range 3 {
		_, err := c.Lookup(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key),
			&ledgerv1.LookupRequest{OperationId: "refused-log-" + hex.EncodeToString([]byte(t.Name()))})
		if status.Code(err) != codes.NotFound {
			t.Fatalf("Lookup with a valid key: %v, want NOT_FOUND", err)
		}
	}
	at.Store(int64(refusalLogEvery - time.Millisecond))
	refused("Bearer " + revoked)
	at.Store(int64(refusalLogEvery))
	refused("Basic " + keySecret) // logged, with the count since the first
	at.Store(int64(refusalLogEvery + time.Second))
	refused("")

	var unauth, notFound []map[string]any
	out := logs.String()
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if rec["msg"] != "finished call" {
			continue
		}
		switch rec["grpc.code"] {
		case "Unauthenticated":
			unauth = append(unauth, rec)
		case "NotFound":
			notFound = append(notFound, rec)
		}
	}
	if len(notFound) != 3 {
		t.Errorf("%d call log lines of authenticated calls, want 3 (one each)", len(notFound))
	}
	var counts []any
	for _, rec := range unauth {
		counts = append(counts, rec["ledger.unlogged_refusals"])
	}
	// 60 + 1 stream + 1 refused calls before the second line: 61 without
	// a line of their own; then the last call, within the interval.
	if len(unauth) != 2 || counts[0] != float64(0) || counts[1] != float64(calls+1) {
		t.Errorf("%d call log lines of refused calls with unlogged counts %v, want 2 with [0 %d] (one per %s)",
			len(unauth), counts, calls+1, refusalLogEvery)
	}
	sum := sha256.Sum256([]byte(revokedSecret))
	keySum := sha256.Sum256([]byte(keySecret))
	for _, s := range []string{revokedSecret, keySecret, wrongSecret, hex.EncodeToString(sum[:]), hex.EncodeToString(keySum[:]),
		strings.ReplaceAll(key, ".", "")} {
		if strings.Contains(out, s) {
			t.Errorf("the log holds key material %q:\n%s", s, out)
		}
	}
}
