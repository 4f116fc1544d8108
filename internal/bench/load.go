package bench

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Call is one unit of work: one RPC, or a fixed sequence of them (a
// Reserve+Complete cycle). seq is unique across the workers of one Run.
type Call func(ctx context.Context, seq int64) error

// Spec describes one closed-loop run: Concurrency workers each call Call
// again as soon as the previous call returns.
type Spec struct {
	Name        string
	Concurrency int
	// Warmup runs calls that are not counted, before the measured window.
	Warmup time.Duration
	// Duration is the measured window; with Count set, the run instead
	// stops after Count calls (all counted, no warmup).
	Duration time.Duration
	Count    int64
	// RPCs is how many RPCs one call makes (1 unless it is a cycle).
	RPCs int
	// Window, when set, is called when the measured window starts and when
	// it ends (to sample CPU counters).
	Window func(start bool)
}

// Result is what a run measured.
type Result struct {
	Spec
	Calls    int64
	Errors   int64
	FirstErr error
	Elapsed  time.Duration
	// CPU is the CPU time per call of each process (when known).
	CPU CPU
	lat []time.Duration // sorted
}

// RPS is calls per second over the measured window.
func (r *Result) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Calls) / r.Elapsed.Seconds()
}

// Quantile returns the q-quantile (0..1) of the call latencies.
func (r *Result) Quantile(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	i := int(q * float64(len(r.lat)))
	if i >= len(r.lat) {
		i = len(r.lat) - 1
	}
	return r.lat[i]
}

// Drive drives call with spec.Concurrency workers and measures every call
// that ends inside the window. Errors are counted, not retried.
func Drive(ctx context.Context, spec Spec, call Call) *Result {
	spec.Concurrency = max(spec.Concurrency, 1)
	spec.RPCs = max(spec.RPCs, 1)
	d := &driver{spec: spec, call: call}
	counted := spec.Count > 0
	if counted || spec.Warmup <= 0 {
		d.begin()
	}
	lats := make([][]time.Duration, spec.Concurrency)
	var wg sync.WaitGroup
	for w := range spec.Concurrency {
		wg.Go(func() { lats[w] = d.work(ctx) })
	}
	if !counted {
		if spec.Warmup > 0 {
			sleep(ctx, spec.Warmup)
			d.begin()
		}
		sleep(ctx, spec.Duration)
		d.stop.Store(true)
	}
	wg.Wait()
	end := time.Now()
	if spec.Window != nil {
		spec.Window(false)
	}
	d.mu.Lock()
	r := &Result{Spec: spec, Errors: d.errs.Load(), FirstErr: d.firstErr, Elapsed: end.Sub(d.start)}
	d.mu.Unlock()
	for _, l := range lats {
		r.lat = append(r.lat, l...)
	}
	r.Calls = int64(len(r.lat))
	slices.Sort(r.lat)
	return r
}

// driver is the state Drive's workers share.
type driver struct {
	spec Spec
	call Call

	seq     atomic.Int64 // the last call's number
	stop    atomic.Bool  // the window is over
	measure atomic.Bool  // the window has begun
	errs    atomic.Int64 // calls that failed in the window

	mu       sync.Mutex
	start    time.Time // when the window began
	firstErr error
}

// begin begins the window.
func (d *driver) begin() {
	if d.spec.Window != nil {
		d.spec.Window(true)
	}
	d.mu.Lock()
	d.start = time.Now()
	d.mu.Unlock()
	d.measure.Store(true)
}

// work makes calls one after the other until the window or the count is
// over, and returns the latencies of those that succeeded in the window.
func (d *driver) work(ctx context.Context) []time.Duration {
	local := make([]time.Duration, 0, 4096)
	for !d.stop.Load() && ctx.Err() == nil {
		n := d.seq.Add(1)
		if d.spec.Count > 0 && n > d.spec.Count {
			break
		}
		t0 := time.Now()
		err := d.call(ctx, n)
		took := time.Since(t0)
		if !d.measure.Load() {
			continue
		}
		if err != nil {
			if d.errs.Add(1) == 1 {
				d.mu.Lock()
				d.firstErr = err
				d.mu.Unlock()
			}
			continue
		}
		local = append(local, took)
	}
	return local
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
