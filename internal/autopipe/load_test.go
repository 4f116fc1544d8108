package autopipe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redistest"
)

// TestRandomContextsUnderLoad runs many callers whose contexts end at
// random, some of them before their batch forms, some while it is in flight,
// some of them sending slow scripts, with the script cache flushed now and
// then (NOSCRIPT in the middle of a batch). Every call must return its own
// reply or its context's error, every caller must return, and the lanes must
// all be free at the end.
func TestRandomContextsUnderLoad(t *testing.T) {
	srv := redistest.Start(t)
	slow := redis.NewScript(`
		local function now()
			local t = redis.call('TIME')
			return tonumber(t[1]) * 1e6 + tonumber(t[2])
		end
		local stop = now() + tonumber(ARGV[2])
		while now() < stop do end
		return ARGV[1]`)
	for _, o := range []Options{{Lanes: 1, MaxBatch: 3}, {Lanes: 2}, {Lanes: 4, MaxBatch: 5}} {
		t.Run(fmt.Sprintf("lanes=%d,max=%d", o.Lanes, o.MaxBatch), func(t *testing.T) {
			rdb := srv.Client(t)
			h := Enable(rdb, o)
			defer h.Close()
			ctx := context.Background()
			var wg sync.WaitGroup
			var mu sync.Mutex
			var answered, ended int
			for g := range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 7))
					for i := range 60 {
						want := strconv.Itoa(g*1000 + i)
						c, cancel := context.WithCancel(ctx)
						switch r.IntN(4) {
						case 0:
							c, cancel = context.WithTimeout(ctx, time.Duration(r.IntN(2000))*time.Microsecond)
						case 1:
							time.AfterFunc(time.Duration(r.IntN(1500))*time.Microsecond, cancel)
						case 2:
							c = ctx // a context that cannot end
						}
						s, args := echo, []any{want}
						if r.IntN(5) == 0 {
							s, args = slow, append(args, r.IntN(300))
						}
						if r.IntN(10) == 0 {
							rdb.ScriptFlush(ctx)
						}
						got, err := s.Run(c, rdb, []string{"k" + want}, args...).Text()
						cancel()
						mu.Lock()
						switch {
						case err == nil && got == want:
							answered++
						case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
							ended++
						default:
							t.Errorf("call %s = %q, %v", want, got, err)
						}
						mu.Unlock()
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("callers still waiting after 60s")
			}
			waitIdle(t, h)
			batches, commands := h.Stats()
			t.Logf("%d answered, %d ended by their context; %d commands in %d batches", answered, ended, commands, batches)
		})
	}
}

// TestConnectionsKilledMidBatch has Redis kill the hook's connections every
// few milliseconds while many callers with deadlines send scripts: batches
// fail and are retried whole, and every reply that arrives must be its
// caller's own; every caller must return, and the lanes must all be free at
// the end.
func TestConnectionsKilledMidBatch(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	killer := srv.Client(t)
	h := Enable(rdb, Options{Lanes: 2})
	defer h.Close()
	ctx := context.Background()
	stop := make(chan struct{})
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				killer.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
			}
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var answered, failed int
	for g := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				want := strconv.Itoa(g*1000 + i)
				c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				got, err := echo.Run(c, rdb, []string{"k" + want}, want).Text()
				cancel()
				mu.Lock()
				switch {
				case err != nil:
					failed++
				case got != want:
					t.Errorf("call %s = %q: another call's reply", want, got)
				default:
					answered++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-killed
	waitIdle(t, h)
	if answered == 0 {
		t.Fatalf("no call answered (%d failed)", failed)
	}
	t.Logf("%d answered, %d failed", answered, failed)
}

// TestLeaderOutsideItsOwnBatch: with more lanes than MaxBatch, a caller
// handed a lane may find its own command beyond the oldest MaxBatch queued
// ones, and send a batch of others first. When that batch lands the caller
// must send the next one, not wait for its context to end. The scripts are
// instant; a call that waits out its generous deadline is the defect.
func TestLeaderOutsideItsOwnBatch(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	h := Enable(rdb, Options{Lanes: 2, MaxBatch: 1})
	defer h.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	late := 0
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				want := strconv.Itoa(g*1000 + i)
				got, err := echo.Run(ctx, rdb, nil, want).Text()
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					mu.Lock()
					late++
					mu.Unlock()
				case err != nil || got != want:
					t.Errorf("call %s: %q, %v", want, got, err)
				}
			}
		}()
	}
	wg.Wait()
	if late > 0 {
		t.Fatalf("%d calls of instant scripts waited out their 10s deadline", late)
	}
}
