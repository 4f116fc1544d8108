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
	if spec.Concurrency < 1 {
		spec.Concurrency = 1
	}
	if spec.RPCs < 1 {
		spec.RPCs = 1
	}
	var (
		seq      atomic.Int64
		stop     atomic.Bool
		measure  atomic.Bool
		errs     atomic.Int64
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
		lats     = make([][]time.Duration, spec.Concurrency)
	)
	counted := spec.Count > 0
	if counted || spec.Warmup <= 0 {
		measure.Store(true)
	}
	var start time.Time
	var startMu sync.Mutex
	setStart := func() {
		if spec.Window != nil {
			spec.Window(true)
		}
		startMu.Lock()
		start = time.Now()
		startMu.Unlock()
	}
	if measure.Load() {
		setStart()
	}
	for w := range spec.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			for !stop.Load() && ctx.Err() == nil {
				n := seq.Add(1)
				if counted && n > spec.Count {
					break
				}
				t0 := time.Now()
				err := call(ctx, n)
				d := time.Since(t0)
				if !measure.Load() {
					continue
				}
				if err != nil {
					errs.Add(1)
					errOnce.Do(func() { firstErr = err })
					continue
				}
				local = append(local, d)
			}
			lats[w] = local
		}()
	}
	if !counted {
		if spec.Warmup > 0 {
			sleep(ctx, spec.Warmup)
			setStart()
			measure.Store(true)
		}
		sleep(ctx, spec.Duration)
		stop.Store(true)
	}
	wg.Wait()
	end := time.Now()
	if spec.Window != nil {
		spec.Window(false)
	}
	startMu.Lock()
	elapsed := end.Sub(start)
	startMu.Unlock()
	r := &Result{Spec: spec, Errors: errs.Load(), FirstErr: firstErr, Elapsed: elapsed}
	for _, l := range lats {
		r.lat = append(r.lat, l...)
	}
	r.Calls = int64(len(r.lat))
	slices.Sort(r.lat)
	return r
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
