package autopipe

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redistest"
)

var echo = redis.NewScript(`return ARGV[1]`)

// TestConcurrentCallersGetTheirOwnReplies runs many callers through the hook
// and checks every reply reaches its own caller, and that they shared
// batches.
func TestConcurrentCallersGetTheirOwnReplies(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	h := Enable(rdb, Options{})
	defer h.Close()
	ctx := context.Background()
	const callers, each = 64, 100
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				want := strconv.Itoa(g*each + i)
				got, err := echo.Run(ctx, rdb, []string{"k" + want}, want).Text()
				if err != nil || got != want {
					errs <- errors.New("got " + got + ", want " + want + ": " + errString(err))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	batches, commands := h.Stats()
	// The first run of each caller may be an EVAL after a NOSCRIPT.
	if commands < callers*each || batches >= commands {
		t.Fatalf("%d commands in %d batches: want at least %d commands, in fewer batches", commands, batches, callers*each)
	}
	// Everything else goes out as before.
	if err := rdb.Set(ctx, "plain", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestQueuedCallWhoseContextEndsIsNotSent holds the only lane with a slow
// script, queues another call whose deadline ends before the lane frees, and
// checks that call returns its context's error and never runs.
func TestQueuedCallWhoseContextEndsIsNotSent(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	h := Enable(rdb, Options{Lanes: 1})
	defer h.Close()
	ctx := context.Background()
	slow := redis.NewScript(`
		local t = redis.call('TIME')
		local stop = tonumber(t[1]) + 2
		while tonumber(redis.call('TIME')[1]) < stop do end
		return 'slow'`)
	incr := redis.NewScript(`return redis.call('INCR', KEYS[1])`)
	for _, s := range []*redis.Script{slow, incr} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- slow.Run(ctx, rdb, []string{"s"}).Err() }()
	for {
		if b, _ := h.Stats(); b > 0 {
			break // the slow script's batch is out: the lane is busy
		}
		select {
		case err := <-done:
			t.Fatalf("the slow script returned before the test could queue behind it: %v", err)
		default:
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	queued := make(chan error, 1)
	go func() { queued <- incr.Run(cctx, rdb, []string{"counter"}).Err() }()
	for {
		h.mu.Lock()
		n := len(h.pending)
		h.mu.Unlock()
		if n > 0 {
			break
		}
	}
	cancel()
	if err := <-queued; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued call = %v, want its context's error", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The lane is free again, and the abandoned call never ran.
	if n, err := incr.Run(ctx, rdb, []string{"counter"}).Int(); err != nil || n != 1 {
		t.Fatalf("counter = %d, %v; want 1 (the abandoned call never sent)", n, err)
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
