package server

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/ledger"
)

// fuzzStack is one embedded store and handler shared by a fuzzing process,
// with a victim tenant's operation the fuzzed calls must never touch.
type fuzzStack struct {
	m      *miniredis.Miniredis
	h      *handler
	victim *ledgerv1.Operation
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
		fuzzEnv = &fuzzStack{m: m, h: h, victim: look.Operation}
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
	f.Fuzz(func(t *testing.T, method byte, data []byte) {
		s := fuzzSetup(t)
		ctx := WithPrincipal(context.Background(), attacker)
		before := s.m.Dump()
		var err error
		switch method % 7 {
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
	})
}
