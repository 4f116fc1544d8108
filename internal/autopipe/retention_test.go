package autopipe

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
	"weak"
)

// tracedArg is a script argument whose collection a test can see (through
// a weak pointer).
type tracedArg struct{ b []byte }

// MarshalBinary implements encoding.BinaryMarshaler: go-redis sends the
// argument as its bytes.
func (a *tracedArg) MarshalBinary() ([]byte, error) { return a.b, nil }

// TestReturnedCallsAreNotKept queues calls behind a held lane and checks
// that, once they have all returned and the hook is idle, it keeps none of
// them reachable: what a burst of callers sent (and got back) is garbage
// once they are gone, however many queued at its peak, whether their batch
// answered them ("answered") or their contexts ended while they waited and
// no call came after them ("abandoned").
func TestReturnedCallsAreNotKept(t *testing.T) {
	for _, abandon := range []bool{false, true} {
		name := "answered"
		if abandon {
			name = "abandoned"
		}
		t.Run(name, func(t *testing.T) {
			_, p, rdb, h := newHeldHook(t, false, Options{Lanes: 1})
			ctx := context.Background()
			const marker = "held:occupant"
			held := p.hold(marker)
			occupant := make(chan error, 1)
			go func() { occupant <- echo.Run(ctx, rdb, []string{marker}, "o").Err() }()
			waitClosed(t, held.seen, "request of the occupant at the proxy")

			const callers = 16
			qctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var traced []weak.Pointer[tracedArg]
			results := make(chan error, callers)
			for range callers {
				a := &tracedArg{b: []byte("payload")}
				traced = append(traced, weak.Make(a))
				go func() { results <- echo.Run(qctx, rdb, []string{"k"}, a).Err() }()
			}
			waitPending(t, h, callers)
			if abandon {
				cancel()
				for range callers {
					if err := waitErr(t, results, "a queued call"); !errors.Is(err, context.Canceled) {
						t.Fatalf("queued call = %v, want its context's error", err)
					}
				}
				held.release()
				if err := waitErr(t, occupant, "the occupant"); err != nil {
					t.Fatal(err)
				}
			} else {
				held.release()
				for _, c := range []chan error{occupant, results} {
					for range cap(c) {
						if err := waitErr(t, c, "a call"); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			waitIdle(t, h)

			// Collected by the first collection, unless a caller's
			// goroutine has not quite ended yet; the hook would keep
			// them for good.
			kept := callers
			for stop := time.Now().Add(10 * time.Second); kept > 0 && time.Now().Before(stop); time.Sleep(10 * time.Millisecond) {
				runtime.GC()
				kept = 0
				for _, w := range traced {
					if w.Value() != nil {
						kept++
					}
				}
			}
			if kept > 0 {
				t.Errorf("%d of %d calls still reachable 10s after they all returned", kept, callers)
			}
		})
	}
}
