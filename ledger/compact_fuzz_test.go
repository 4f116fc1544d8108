package ledger

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

var (
	compactFuzzOnce sync.Once
	compactFuzzL    *Ledger
	compactFuzzRDB  *redis.Client
	compactFuzzSeed []string
	compactFuzzNow  time.Time // the store's clock, past the seeds' retention
)

// compactFuzzSetup starts one embedded store for the fuzzing process, with
// a ledger whose terminal records leave their retention after a second and
// a clock an hour ahead of them, and returns real stored records to start
// from.
func compactFuzzSetup(tb testing.TB) (*Ledger, *redis.Client, []string) {
	compactFuzzOnce.Do(func() {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			tb.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true})
		pol, err := ParsePolicies([]byte("tools:\n  - match: \"*\"\n    retention: 1s\n    retain_grace: 0s\n    tombstone_retention: 1h\n"))
		if err != nil {
			tb.Fatal(err)
		}
		l, err := New(rdb, Options{Policies: pol})
		if err != nil {
			tb.Fatal(err)
		}
		ctx := context.Background()
		who := Principal{Tenant: "seed", ID: "p"}
		var seeds []string
		for i, out := range []Outcome{OutcomeSucceeded, OutcomeFailedFinal, OutcomeFailedRetryable, 0} {
			id := strings.Repeat("x", i+1)
			r, err := l.Reserve(ctx, who, ReserveRequest{OperationID: id, Tool: "t", Params: map[string]any{"a": 1.0}, Holder: "h"})
			if err != nil {
				tb.Fatal(err)
			}
			if out != 0 {
				req := CompleteRequest{OperationID: id, FencingToken: r.Operation.FencingToken, Outcome: out,
					Result: &Result{ResourceID: "r", Data: []byte(`{"d":"customer"}`)}}
				if out != OutcomeSucceeded {
					req.Result, req.Failure = nil, &Failure{Code: "c", Message: "customer"}
				}
				if _, err := l.Complete(ctx, who, req); err != nil {
					tb.Fatal(err)
				}
			}
			v, err := rdb.Get(ctx, l.keys.op(who.Tenant, id).all[0]).Result()
			if err != nil {
				tb.Fatal(err)
			}
			seeds = append(seeds, v)
		}
		// The store's clock moves on past the seeds' retention.
		compactFuzzNow = time.Now().Add(time.Hour).Truncate(time.Millisecond)
		m.SetTime(compactFuzzNow)
		compactFuzzL, compactFuzzRDB, compactFuzzSeed = l, rdb, seeds
	})
	return compactFuzzL, compactFuzzRDB, compactFuzzSeed
}

// FuzzCompactScript runs the compaction script on arbitrary values stored
// under a record's key. It never fails on one (a value it cannot read must
// not stop a walk), it writes only a terminal record past its retention (as
// the Go decoder reads it), then only its tombstone (tombstoneOf: the first
// four fields, an empty attempt and the consequential fields) with the key's
// TTL, and what it leaves is read as expired.
func FuzzCompactScript(f *testing.F) {
	l, rdb, seeds := compactFuzzSetup(f)
	for _, s := range seeds {
		f.Add(s)
	}
	f.Add("L" + strings.Repeat("f", 32) + "3\xff1d\xffk1\xffs\xff2\xff")
	f.Add("L")
	f.Add("")
	who := Principal{Tenant: "fuzz", ID: "p"}
	key := l.keys.op(who.Tenant, "op").all[0]
	f.Fuzz(func(t *testing.T, v string) {
		ctx := context.Background()
		if err := rdb.Set(ctx, key, v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		n, err := compactScript.Run(ctx, rdb, []string{key}).Int()
		if err != nil {
			t.Fatalf("compact.lua on %q: %v", v, err)
		}
		after, err := rdb.Get(ctx, key).Result()
		if err != nil {
			t.Fatalf("the key is gone after compact.lua on %q: %v", v, err)
		}
		if n == 0 {
			if after != v {
				t.Fatalf("compact.lua said it left %q alone, and wrote %q", v, after)
			}
			return
		}
		o, _, derr := decodeRecord(v)
		if derr != nil || !o.State.Terminal() || o.ExpiresAt.After(compactFuzzNow) {
			t.Fatalf("compact.lua cut %q, which is no terminal record past its retention (%+v, %v)", v, o, derr)
		}
		if want := tombstoneOf(v); after != want || len(after) >= len(v) {
			t.Fatalf("compact.lua wrote %q for %q: want its shorter tombstone %q", after, v, want)
		}
		if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Hour {
			t.Fatalf("PTTL after compaction = %v, want the hour it had", ttl)
		}
		if _, err := l.Lookup(ctx, who, "op"); KindOf(err) != KindKeyExpired {
			t.Fatalf("Lookup of the tombstone cut from %q = %v, want expired", v, err)
		}
	})
}
