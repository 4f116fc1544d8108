// Command peer runs the benchmark's Reserve+Complete cycle in-process with
// github.com/faustbrian/go-idempotency (its Valkey store through valkey-go:
// Acquire of a new key, then Complete with a 100-byte result), for
// ledgerbench's peer part (docs/benchmarks.md). It is its own module so that
// the peer stays out of the service's module graph.
//
// It speaks the cycler protocol of internal/bench/peer.go: after the warmup
// it prints "start", after the window "end CALLS ERRORS ELAPSED_NS" (with
// --count: that many cycles, no warmup), preceded by "error MESSAGE" when a
// cycle failed.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	idempotency "github.com/faustbrian/go-idempotency"
	idvalkey "github.com/faustbrian/go-idempotency/valkey"
	valkeygo "github.com/valkey-io/valkey-go"
)

// refundParams are the parameters of internal/bench's Reserve, canonicalized
// by the caller as the peer expects.
var refundParams = map[string]any{
	"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250, "currency": "eur", "reason": "requested_by_customer",
}

// result is {"id":"…"}, 100 bytes, as internal/bench records.
var result = []byte(`{"id":"` + strings.Repeat("r", 100-len(`{"id":""}`)) + `"}`)

func main() {
	redisAddr := flag.String("redis-addr", "", "the Redis to store the records in")
	prefix := flag.String("prefix", "peer", "the operation ids' prefix")
	conc := flag.Int("concurrency", 50, "concurrent cycles")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured cycles before the window")
	window := flag.Duration("duration", 10*time.Second, "the measured window")
	count := flag.Int64("count", 0, "run exactly this many cycles instead of a window")
	flag.Parse()
	if err := run(*redisAddr, *prefix, *conc, *warmup, *window, *count); err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		os.Exit(1)
	}
}

func run(addr, prefix string, conc int, warmup, window time.Duration, count int64) error {
	client, err := valkeygo.NewClient(valkeygo.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		return err
	}
	defer client.Close()
	// New, not Open: Open refuses servers other than Valkey 9.
	store, err := idvalkey.New(client, idvalkey.Options{Prefix: "peerbench", Retention: 7 * 24 * time.Hour, OwnerTokens: ownerToken})
	if err != nil {
		return err
	}
	canonical, err := json.Marshal(refundParams)
	if err != nil {
		return err
	}
	cycle := func(ctx context.Context, seq int64) error {
		key, err := idempotency.NewKey("bench", "default", "payments.refund", "bench", fmt.Sprintf("wf-%s%07d:refund", prefix, seq))
		if err != nil {
			return err
		}
		fp, err := idempotency.NewFingerprint("v1", canonical)
		if err != nil {
			return err
		}
		got, err := store.Acquire(ctx, idempotency.AcquireRequest{Key: key, Fingerprint: fp, Lease: time.Hour})
		if err != nil {
			return err
		}
		if got.Outcome != idempotency.OutcomeAcquired {
			return fmt.Errorf("acquire of a new key: %v", got.Outcome)
		}
		_, err = store.Complete(ctx, idempotency.CompleteRequest{Ownership: got.Record.Ownership(), Result: result})
		return err
	}
	drive(context.Background(), conc, warmup, window, count, cycle)
	return nil
}

// ownerToken is 32 random bytes in hex, as the peer's documentation asks.
func ownerToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// drive runs cycle on conc workers and prints the protocol's lines. A
// cycle counts when it ends inside the window.
func drive(ctx context.Context, conc int, warmup, window time.Duration, count int64, cycle func(context.Context, int64) error) {
	var (
		seq, calls, errs atomic.Int64
		measuring, stop  atomic.Bool
		first            atomic.Value
		wg               sync.WaitGroup
	)
	if count > 0 {
		// Every cycle counts: the window starts before the first.
		measuring.Store(true)
		fmt.Println("start")
	}
	for range conc {
		wg.Go(func() {
			for !stop.Load() {
				n := seq.Add(1)
				if count > 0 && n > count {
					return
				}
				err := cycle(ctx, n)
				switch {
				case !measuring.Load():
				case err == nil:
					calls.Add(1)
				case errs.Add(1) == 1:
					first.Store(err.Error())
				}
			}
		})
	}
	start := time.Now()
	if count == 0 {
		time.Sleep(warmup)
		fmt.Println("start")
		start = time.Now()
		measuring.Store(true)
		time.Sleep(window)
		stop.Store(true)
	}
	wg.Wait()
	elapsed := time.Since(start)
	if msg, ok := first.Load().(string); ok {
		fmt.Println("error", strings.ReplaceAll(msg, "\n", " "))
	}
	fmt.Println("end", calls.Load(), errs.Load(), int64(elapsed))
}
