package ledger

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opledger/ledger/internal/redistest"
)

// benchRecord is a SUCCEEDED record as the scripts store it: a refund with a
// 100-byte result and its two history entries.
func benchRecord(tb testing.TB) string {
	tb.Helper()
	rdb := redistest.Shared(tb).Client(tb)
	l, err := New(rdb, Options{})
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	who := Principal{Tenant: "bench-" + randomHex(4), ID: "anonymous"}
	res, err := l.Reserve(ctx, who, ReserveRequest{OperationID: "wf-1:refund", Tool: "payments.refund",
		Params: map[string]any{"amount": 1250.0, "currency": "eur"}, PermitID: "approval-77", Holder: "h-1"})
	if err != nil {
		tb.Fatal(err)
	}
	data := []byte(`{"id":"` + strings.Repeat("r", 91) + `"}`)
	if _, err := l.Complete(ctx, who, CompleteRequest{OperationID: "wf-1:refund", FencingToken: res.Operation.FencingToken,
		Outcome: OutcomeSucceeded, Result: &Result{Data: data}}); err != nil {
		tb.Fatal(err)
	}
	s, err := rdb.Get(ctx, l.keys.op(who.Tenant, "wf-1:refund").all[0]).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// BenchmarkDecodeRecord decodes a record as every RPC's reply does.
func BenchmarkDecodeRecord(b *testing.B) {
	s := benchRecord(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := decodeRecord(s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseHistory decodes the history, as Lookup does.
func BenchmarkParseHistory(b *testing.B) {
	s := benchRecord(b)
	o, h, err := decodeRecord(s)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(parseHistory(h, o.CreatedAt)) != 2 {
			b.Fatal("want 2 entries")
		}
	}
}

// benchLedger is a ledger on the shared redis-server with a tenant of its
// own.
func benchLedger(b *testing.B) (*Ledger, Principal) {
	b.Helper()
	l, err := New(redistest.Shared(b).Client(b), Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := l.LoadScripts(context.Background()); err != nil {
		b.Fatal(err)
	}
	return l, Principal{Tenant: "bench-" + randomHex(4), ID: "anonymous"}
}

// BenchmarkReserve is ledger.Reserve of new keys, one at a time: validation,
// fingerprint, the script's round trip on a real redis-server, the reply.
func BenchmarkReserve(b *testing.B) {
	l, who := benchLedger(b)
	ctx := context.Background()
	params := map[string]any{"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250.0, "currency": "eur", "reason": "requested_by_customer"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := l.Reserve(ctx, who, ReserveRequest{OperationID: "wf-" + strconv.Itoa(i) + ":refund", Tool: "payments.refund",
			Params: params, PermitID: "approval-77", Holder: "h-1"}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReserveParallel is BenchmarkReserve from many goroutines.
func BenchmarkReserveParallel(b *testing.B) {
	l, who := benchLedger(b)
	ctx := context.Background()
	params := map[string]any{"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250.0, "currency": "eur", "reason": "requested_by_customer"}
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := "wf-" + strconv.FormatInt(n.Add(1), 10) + ":refund"
			if _, err := l.Reserve(ctx, who, ReserveRequest{OperationID: id, Tool: "payments.refund",
				Params: params, PermitID: "approval-77", Holder: "h-1"}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLookup reads one SUCCEEDED operation with its history.
func BenchmarkLookup(b *testing.B) {
	l, who := benchLedger(b)
	ctx := context.Background()
	res, err := l.Reserve(ctx, who, ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := l.Complete(ctx, who, CompleteRequest{OperationID: "op", FencingToken: res.Operation.FencingToken,
		Outcome: OutcomeSucceeded, Result: &Result{Data: []byte(`{"id":"r-1"}`)}}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Lookup(ctx, who, "op"); err != nil {
			b.Fatal(err)
		}
	}
}
