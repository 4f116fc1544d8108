package bench

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
)

// TestBareServer checks the bare server the benchmark compares the ledger
// with: each health Check is SERVING and costs Redis exactly one script
// call, with and without auto-pipelining; in the ledger variant, that
// script is a Reserve that records one new operation under BarePrefix.
func TestBareServer(t *testing.T) {
	for _, o := range []BareOptions{{}, {Plain: true}, {Ledger: true}} {
		srv := redistest.Start(t)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		o.Listener, o.Listen, o.RedisAddr = ln, ln.Addr().String(), srv.Addr
		ctx, cancel := context.WithCancel(context.Background())
		var serveErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			serveErr = ServeBare(ctx, o)
		}()
		t.Cleanup(func() { cancel(); <-done })
		if err := ledgertest.WaitServing(o.Listen, done, 20*time.Second); err != nil {
			cancel()
			<-done
			t.Fatalf("ServeBare %v (%v)", err, serveErr)
		}
		rdb := srv.Client(t)
		before, recordsBefore := commandCalls(t, rdb), bareRecords(t, rdb)
		conn, err := grpc.NewClient(o.Listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		const n = 20
		for range n {
			r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
			if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("%+v: Check = %v, %v", o, r, err)
			}
		}
		after := commandCalls(t, rdb)
		if got := after["fcall"] + after["evalsha"] + after["eval"] - before["fcall"] - before["evalsha"] - before["eval"]; got != n {
			t.Fatalf("%+v: %d scripts for %d checks, want one each", o, got, n)
		}
		records := bareRecords(t, rdb) - recordsBefore
		if want := map[bool]int{false: 0, true: n}[o.Ledger]; records != want {
			t.Fatalf("%+v: %d new records after %d checks, want %d", o, records, n, want)
		}
	}
}

// bareRecords counts the operation records in rdb, and fails the test if
// a key lies outside BarePrefix.
func bareRecords(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	keys, err := rdb.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, k := range keys {
		if !strings.HasPrefix(k, BarePrefix+":") {
			t.Fatalf("key %q outside the prefix %q", k, BarePrefix)
		}
		if strings.Contains(k, ":op:") {
			n++
		}
	}
	return n
}
