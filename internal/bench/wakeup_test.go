package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/autopipe"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// BenchmarkWakeups measures, at concurrency 1 and without gRPC, a trivial
// script's round trip and a whole ledger.Reserve of a new key, first with
// the machine otherwise idle, then with one goroutine kept spinning so that
// one core never idles. The difference is what waking an idle CPU costs
// the calls (docs/benchmarks.md §5.2):
//
//	go test -run '^$' -bench Wakeups ./internal/bench
func BenchmarkWakeups(b *testing.B) {
	rdb, l := benchLedger(b)
	ctx := context.Background()
	if err := l.LoadScripts(ctx); err != nil {
		b.Fatal(err)
	}
	trivial := redis.NewScript("return 1")
	if err := trivial.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	who := ledger.Principal{Tenant: "default", ID: "bench"}
	run := RunID()
	var seq atomic.Int64
	calls := []struct {
		name string
		call func() error
	}{
		{"script=return-1", func() error { return trivial.EvalSha(ctx, rdb, []string{"k"}).Err() }},
		{"Reserve", func() error {
			n := seq.Add(1)
			_, err := l.Reserve(ctx, who, ledger.ReserveRequest{
				OperationID: OperationID(run, n), Tool: "payments.refund", Params: refundParams,
				PermitID: "approval-77", Holder: holder(n),
			})
			return err
		}},
	}
	for _, busy := range []bool{false, true} {
		for _, c := range calls {
			b.Run(fmt.Sprintf("%s/busy=%v", c.name, busy), func(b *testing.B) {
				if busy {
					var stop atomic.Bool
					done := make(chan struct{})
					go func() {
						defer close(done)
						for !stop.Load() {
						}
					}()
					defer func() { stop.Store(true); <-done }()
				}
				for b.Loop() {
					if err := c.call(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// benchLedger starts a redis-server for the benchmark and returns a client
// of it with autopipelining, as ledgerd's, and a ledger with the default
// policies on it.
func benchLedger(b *testing.B) (*redis.Client, *ledger.Ledger) {
	rdb := redistest.Start(b).Client(b)
	autopipe.Enable(rdb, autopipe.Options{})
	l, err := ledger.New(rdb, ledger.Options{Policies: ledger.DefaultPolicies()})
	if err != nil {
		b.Fatal(err)
	}
	return rdb, l
}
