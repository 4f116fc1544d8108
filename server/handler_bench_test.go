package server

import (
	"bytes"
	"context"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
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
	l, err := ledger.New(redistest.Start(b).Client(b), ledger.Options{Policies: ledger.DefaultPolicies()})
	if err != nil {
		b.Fatal(err)
	}
	h := &handler{l: l, anon: ledger.Principal{Tenant: DefaultTenant, ID: "anonymous"}}
	codec := newRequestCodec(DefaultMaxRequestBytes)
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
