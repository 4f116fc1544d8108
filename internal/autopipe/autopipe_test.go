package autopipe

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redistest"
)

var echo = redis.NewScript(`return ARGV[1]`)

// TestConcurrentCallersGetTheirOwnReplies runs many callers through the hook,
// each sending scripts and EXISTS, and checks every reply reaches its own
// caller, and that they shared batches.
func TestConcurrentCallersGetTheirOwnReplies(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	h := Enable(rdb, Options{})
	defer h.Close()
	ctx := context.Background()
	if err := rdb.Set(ctx, "k7", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
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
				n, err := rdb.Do(ctx, "exists", "k"+want).Int64()
				if err != nil || (n == 1) != (want == "7") {
					errs <- fmt.Errorf("EXISTS k%s = %d, %v", want, n, err)
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
	if commands < 2*callers*each || batches >= commands {
		t.Fatalf("%d commands in %d batches: want at least %d commands, in fewer batches", commands, batches, 2*callers*each)
	}
	// Everything else goes out as before.
	if err := rdb.Set(ctx, "plain", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestFirstKey: the first key of each command the hook batches, and none of
// a script without keys or a command it does not batch.
func TestFirstKey(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		args []any
		key  string // "": none
	}{
		{args: []any{"fcall", "reserve", 5, "a", "b", "x"}, key: "a"},
		{args: []any{"EVALSHA", "abc", int64(1), "a"}, key: "a"},
		{args: []any{"eval", "return 1", 0}},
		{args: []any{"eval", "return 1", "1", "a"}},
		{args: []any{"exists", "r"}, key: "r"},
		{args: []any{"EXISTS"}},
		{args: []any{"get", "a"}},
	} {
		key, ok := firstKey(redis.NewCmd(ctx, c.args...))
		if key != c.key || ok != (c.key != "") {
			t.Errorf("firstKey(%v) = %q, %v; want %q", c.args, key, ok, c.key)
		}
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

// TestCallCancelledWhileQueuedIsNeverSent holds the only lane with a call
// whose request the proxy holds, while two calls queue behind it, W and A in
// either order. W's context is cancelled while W is still queued, with h.mu
// held, and the held call is then let through, so that its reply arrives and
// the lane moves on while W's own goroutine waits to mark W abandoned: the
// lane must not go to W (first in line), and the caller that forms the next
// batch must leave W out (second in line), so W returns its context's error
// and its script never runs.
func TestCallCancelledWhileQueuedIsNeverSent(t *testing.T) {
	for _, wAt := range []int{0, 1} {
		t.Run(fmt.Sprintf("W%d", wAt+1), func(t *testing.T) {
			_, p, rdb, h := newHeldHook(t, false, Options{Lanes: 1})
			ctx := context.Background()
			for i := range 5 {
				marker := "held:o" + strconv.Itoa(i)
				held := p.hold(marker)
				occupant := make(chan error, 1)
				go func() { occupant <- echo.Run(ctx, rdb, []string{marker}, "o").Err() }()
				waitClosed(t, held.seen, "request of the occupant at the proxy")
				wctx, cancel := context.WithCancel(ctx)
				key := "w" + strconv.Itoa(i)
				w, a := make(chan error, 1), make(chan error, 1)
				for at := range 2 {
					if at == wAt {
						go func() { w <- incr.Run(wctx, rdb, []string{key}).Err() }()
					} else {
						go func() { a <- echo.Run(ctx, rdb, []string{"a"}, "a").Err() }()
					}
					waitPending(t, h, at+1)
				}
				h.mu.Lock()
				if len(h.pending) != 2 || h.pending[wAt].state != queued || h.active != 1 {
					h.mu.Unlock()
					t.Fatalf("round %d: %d pending, W's state %v, %d lanes active; want W and A queued behind the held call", i, len(h.pending), h.pending[wAt].state, h.active)
				}
				held.release()
				// Give the occupant's reply time to arrive and its caller
				// time to wait for h.mu; then W's context ends, and W's
				// goroutine waits for h.mu too, behind it. (Only the order
				// is at stake: if the reply comes later, W marks itself
				// abandoned first, and the round checks the plainer path.)
				time.Sleep(20 * time.Millisecond)
				cancel() // W is still queued: the lane has not moved
				time.Sleep(time.Millisecond)
				h.mu.Unlock()
				if err := waitErr(t, w, "W"); !errors.Is(err, context.Canceled) {
					t.Fatalf("round %d: W = %v, want its context's error", i, err)
				}
				for _, c := range []chan error{occupant, a} {
					if err := waitErr(t, c, "the occupant and A"); err != nil {
						t.Fatal(err)
					}
				}
				if n, err := rdb.Get(ctx, key).Int(); !errors.Is(err, redis.Nil) {
					t.Fatalf("round %d: %s = %d, %v: W's script ran though W was cancelled while queued", i, key, n, err)
				}
			}
			waitIdle(t, h)
		})
	}
}

// TestBatchSenderReturnsAtItsContextsEnd holds the only lane with a call O
// whose reply the proxy holds, while W, whose context can end, and then X,
// with no deadline, queue behind it. O's reply is let through: W is handed
// the lane and sends W and X, and the proxy holds that batch too. W's
// context ends (its deadline passes, or the test cancels it) while its
// batch's reply is still held: W must return with its context's error
// without waiting for it, and the lane must stay with the batch (Y, queued
// after, waits). Once the reply is let through, X must get its reply (its
// script run once) and the lane be handed on to Y.
func TestBatchSenderReturnsAtItsContextsEnd(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		end  bool // the test cancels W's context (else its deadline passes)
		want error
	}{
		// W's deadline only has to come after W sends its batch: 2s is ample.
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 2*time.Second)
		}, false, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.Background())
		}, true, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, p, rdb, h := newHeldHook(t, false, Options{Lanes: 1})
			ctx := context.Background()
			heldO, heldX := p.hold("held:o"), p.hold("held:x")
			o := make(chan error, 1)
			go func() { o <- echo.Run(ctx, rdb, []string{"held:o"}, "o").Err() }()
			waitClosed(t, heldO.seen, "request of O at the proxy")
			wctx, cancel := tc.ctx()
			defer cancel()
			w := make(chan error, 1)
			go func() { w <- echo.Run(wctx, rdb, []string{"w"}, "w").Err() }()
			waitPending(t, h, 1)
			x := make(chan error, 1)
			go func() { x <- incr.Run(ctx, rdb, []string{"held:x"}).Err() }()
			waitPending(t, h, 2)
			heldO.release()
			if err := waitErr(t, o, "O"); err != nil {
				t.Fatal(err)
			}
			waitClosed(t, heldX.seen, "batch of W and X at the proxy")
			if b, c := h.Stats(); b != 2 || c != 3 {
				t.Fatalf("%d batches of %d commands, want O alone then W and X together (did W's context end before W sent its batch?)", b, c)
			}
			y := make(chan error, 1)
			go func() {
				got, err := echo.Run(ctx, rdb, []string{"y"}, "y").Text()
				if err == nil && got != "y" {
					err = fmt.Errorf("got %q, want %q", got, "y")
				}
				y <- err
			}()
			waitPending(t, h, 1)
			if tc.end {
				cancel()
			}
			if err := waitErr(t, w, "W, whose context ended while its batch's reply was held,"); !errors.Is(err, tc.want) {
				t.Fatalf("W = %v, want %v", err, tc.want)
			}
			select {
			case err := <-x:
				t.Fatalf("X returned (%v) while its reply was held", err)
			case err := <-y:
				t.Fatalf("Y returned (%v) while the only lane was with the held batch", err)
			default:
			}
			heldX.release()
			if err := waitErr(t, x, "X"); err != nil {
				t.Fatalf("X = %v, want its reply", err)
			}
			if err := waitErr(t, y, "Y, queued after W's batch,"); err != nil {
				t.Fatalf("Y = %v, want its reply", err)
			}
			if n, err := rdb.Get(ctx, "held:x").Int(); err != nil || n != 1 {
				t.Fatalf("X's counter = %d, %v; want 1 (X run once)", n, err)
			}
			waitIdle(t, h)
		})
	}
}

// TestLoneCallReturnsAtItsDeadline sends one script alone, with a deadline,
// through a client that lets contexts bound its calls (and has no read
// timeout of its own), and holds its request at a proxy: the call goes out
// as a plain call and returns with DeadlineExceeded at its deadline while
// its reply is still held. Once the proxy lets it through, later calls work
// and the lane is free.
func TestLoneCallReturnsAtItsDeadline(t *testing.T) {
	_, p, rdb, h := newHeldHook(t, true, Options{})
	ctx := context.Background()
	held := p.hold("held:lone")
	// The deadline only has to come after the call is sent: 2s is ample.
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	lone := make(chan error, 1)
	go func() { lone <- incr.Run(cctx, rdb, []string{"held:lone"}).Err() }()
	waitClosed(t, held.seen, "request of the lone call at the proxy")
	if err := waitErr(t, lone, "the lone call, whose reply was held,"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lone call = %v, want %v", err, context.DeadlineExceeded)
	}
	if b, c := h.Stats(); b != 1 || c != 1 {
		t.Fatalf("%d batches of %d commands, want the lone call alone", b, c)
	}
	held.release()
	if got, err := echo.Run(ctx, rdb, []string{"after"}, "after").Text(); err != nil || got != "after" {
		t.Fatalf("call after the lone one = %q, %v; want its reply", got, err)
	}
	waitIdle(t, h)
}

// incr increments KEYS[1] and returns its new value.
var incr = redis.NewScript(`return redis.call('INCR', KEYS[1])`)

// waitPending waits until at least n calls are queued.
func waitPending(t *testing.T, h *Hook, n int) {
	t.Helper()
	waitFor(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.pending) >= n
	}, "%d queued calls", n)
}

// waitIdle waits until no lane is in use and no call is queued, on any
// Redis Cluster master too (whose queues are then gone).
func waitIdle(t *testing.T, h *Hook) {
	t.Helper()
	waitFor(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.pending {
			if c.state == queued {
				return false
			}
		}
		return h.active == 0 && len(h.masters) == 0
	}, "idle hook")
}

func waitFor(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	for stop := time.Now().Add(10 * time.Second); !cond(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(stop) {
			t.Fatalf("no "+format+" after 10s", args...)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// TestReleasePassesOverEndedCalls checks release on its own: the only lane
// is held by a call O whose request the proxy holds, and behind it are
// queued E, a call whose context has ended (cancelled, or past its deadline
// before its timer fired), and then C, a live call. E is queued the way
// ProcessHook queues a call, but with no caller behind it, so nothing else
// can notice that E's context ended: when O's reply is let through, release
// alone decides who gets the lane. It must pass over E (abandoned, its
// caller woken, never sent) and hand the lane to C, whose script then runs
// once. Handing the lane to E would leave it with no one to send C.
func TestReleasePassesOverEndedCalls(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ended func() (done <-chan struct{}, deadline time.Time)
	}{
		{"cancelled", func() (<-chan struct{}, time.Time) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx.Done(), time.Time{}
		}},
		// Its deadline has passed, and its context's timer has not fired
		// yet: take leaves such a call out, so must release.
		{"deadline passed", func() (<-chan struct{}, time.Time) {
			return make(chan struct{}), time.Now().Add(-time.Second)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, p, rdb, h := newHeldHook(t, false, Options{Lanes: 1})
			ctx := context.Background()
			direct := srv.Client(t)
			before := scriptCalls(t, direct)

			held := p.hold("held:o")
			o := make(chan error, 1)
			go func() { o <- echo.Run(ctx, rdb, []string{"held:o"}, "o").Err() }()
			waitClosed(t, held.seen, "request of O at the proxy")

			done, deadline := tc.ended()
			e := &call{inner: redis.NewCmd(ctx, "evalsha", incr.Hash(), 1, "e"), done: done, deadline: deadline,
				wake: make(chan struct{}, 1)}
			h.mu.Lock()
			h.pending = append(h.pending, e)
			h.mu.Unlock()
			c := make(chan error, 1)
			go func() { c <- incr.Run(ctx, rdb, []string{"c"}).Err() }()
			waitPending(t, h, 2)
			h.mu.Lock()
			if h.active != 1 || len(h.pending) != 2 || h.pending[0] != e || e.state != queued || h.pending[1].state != queued {
				h.mu.Unlock()
				t.Fatalf("%d lanes active, %d queued; want E then C queued behind O", h.active, len(h.pending))
			}
			h.mu.Unlock()

			held.release()
			if err := waitErr(t, o, "O"); err != nil {
				t.Fatal(err)
			}
			if err := waitErr(t, c, "C, queued behind the ended call E (was the lane handed to E?),"); err != nil {
				t.Fatalf("C = %v, want its reply", err)
			}
			h.mu.Lock()
			state, lead, woken := e.state, e.lead, len(e.wake)
			h.mu.Unlock()
			if state != abandoned || lead || woken != 1 {
				t.Fatalf("E: state %d, lead %v, %d wake signals; want abandoned (%d), no lane, its caller woken", state, lead, woken, abandoned)
			}
			if n, err := direct.Get(ctx, "c").Int(); err != nil || n != 1 {
				t.Fatalf("C's counter = %d, %v; want 1", n, err)
			}
			if n, err := direct.Get(ctx, "e").Int(); !errors.Is(err, redis.Nil) {
				t.Fatalf("E's counter = %d, %v: E's script ran though its context had ended", n, err)
			}
			if got := scriptCalls(t, direct) - before; got != 2 {
				t.Fatalf("Redis ran %d scripts, want 2 (O and C; never E)", got)
			}
			waitIdle(t, h)
		})
	}
}

// scriptCalls returns how many EVALSHA and EVAL commands Redis has run (INFO
// commandstats).
func scriptCalls(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, prefix := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
				v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				n += v
			}
		}
	}
	return n
}
