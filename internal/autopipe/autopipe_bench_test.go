package autopipe

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redistest"
)

// benchClient is a client of a fresh redis-server with the echo script
// loaded, batching through the hook unless plain.
func benchClient(b *testing.B, plain bool) *redis.Client {
	srv := redistest.Start(b)
	rdb := srv.Client(b)
	if !plain {
		h := Enable(rdb, Options{})
		b.Cleanup(h.Close)
	}
	if err := echo.Load(context.Background(), rdb).Err(); err != nil {
		b.Fatal(err)
	}
	return rdb
}

// benchContext is the context of one call: none that can end, or one with a
// deadline, as a gRPC call's.
func benchContext(deadline bool) (context.Context, context.CancelFunc) {
	if deadline {
		return context.WithTimeout(context.Background(), time.Minute)
	}
	return context.Background(), func() {}
}

func benchSerial(b *testing.B, plain, deadline bool) {
	rdb := benchClient(b, plain)
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := benchContext(deadline)
		if err := echo.Run(ctx, rdb, []string{"k"}, "v").Err(); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
}

func benchParallel(b *testing.B, plain, deadline bool) {
	rdb := benchClient(b, plain)
	b.ReportAllocs()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, cancel := benchContext(deadline)
			if err := echo.Run(ctx, rdb, []string{"k"}, "v").Err(); err != nil {
				b.Error(err)
				cancel()
				return
			}
			cancel()
		}
	})
}

// BenchmarkSerial is one caller at a time: every batch is one script.
func BenchmarkSerial(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchSerial(b, true, false) })
	b.Run("background", func(b *testing.B) { benchSerial(b, false, false) })
	b.Run("deadline", func(b *testing.B) { benchSerial(b, false, true) })
}

// BenchmarkParallel is many callers at once, sharing batches.
func BenchmarkParallel(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchParallel(b, true, false) })
	b.Run("background", func(b *testing.B) { benchParallel(b, false, false) })
	b.Run("deadline", func(b *testing.B) { benchParallel(b, false, true) })
}
