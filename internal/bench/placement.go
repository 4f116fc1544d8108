package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Placement. By default the benchmark's processes (the load generator,
// ledgerd, redis-server, the bare servers) share every CPU of the machine
// and the scheduler moves them at will. With Config.ServerCPUs the servers
// run on those CPUs only (started under taskset, so a Go server's
// GOMAXPROCS follows) and the load generator on the rest: the placement of
// a deployment where the agents are on other machines and ledgerd runs
// beside its Redis (docs/benchmarks.md, section 5.2).

// parseCPUList parses a CPU list in the form taskset -c takes: "1",
// "0,2", "2-3", "0-1,4". It returns the CPUs in ascending order, each once.
func parseCPUList(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty CPU list")
	}
	var cpus []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := cpuNumber(lo)
		if err != nil {
			return nil, fmt.Errorf("CPU list %q: %w", s, err)
		}
		last := first
		if isRange {
			if last, err = cpuNumber(hi); err != nil {
				return nil, fmt.Errorf("CPU list %q: %w", s, err)
			}
			if last < first {
				return nil, fmt.Errorf("CPU list %q: range %q runs backwards", s, part)
			}
		}
		for c := first; c <= last; c++ {
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

// maxCPUs is how many CPUs an affinity mask (unix.CPUSet) holds.
const maxCPUs = 1024

// cpuNumber parses one CPU number of a CPU list.
func cpuNumber(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 || n >= maxCPUs {
		return 0, fmt.Errorf("%q is not a CPU number", s)
	}
	return n, nil
}

// cpuListString formats ascending CPUs as a list taskset -c takes, in the
// form of the kernel's Cpus_allowed_list: runs of consecutive CPUs as
// "a-b", e.g. "0-2,4".
func cpuListString(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, strconv.Itoa(cpus[i])+"-"+strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// allowedCPUs returns the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	return setCPUs(&set), nil
}

func setCPUs(set *unix.CPUSet) []int {
	var cpus []int
	for c := range maxCPUs {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// placement is where the servers and the load generator run.
type placement struct {
	server, load []int
	taskset      string // the taskset binary the servers are started with
}

// newPlacement checks a ServerCPUs value: CPUs this process may use, and
// at least one of those left for the load generator.
func newPlacement(serverCPUs string) (*placement, error) {
	server, err := parseCPUList(serverCPUs)
	if err != nil {
		return nil, err
	}
	allowed, err := allowedCPUs()
	if err != nil {
		return nil, fmt.Errorf("reading this process's CPUs: %w", err)
	}
	var load []int
	for _, c := range allowed {
		if !slices.Contains(server, c) {
			load = append(load, c)
		}
	}
	for _, c := range server {
		if !slices.Contains(allowed, c) {
			return nil, fmt.Errorf("server CPUs %s: CPU %d is not one this process may use (%s)", serverCPUs, c, cpuListString(allowed))
		}
	}
	if len(load) == 0 {
		return nil, fmt.Errorf("server CPUs %s: no CPU is left for the load generator (this process may use %s)", serverCPUs, cpuListString(allowed))
	}
	ts, err := exec.LookPath("taskset")
	if err != nil {
		return nil, fmt.Errorf("server CPUs need taskset (util-linux) to start the servers: %w", err)
	}
	return &placement{server: server, load: load, taskset: ts}, nil
}

// command returns the command line that starts bin on the server CPUs.
func (p *placement) command(bin string, args []string) (string, []string) {
	if p == nil {
		return bin, args
	}
	return p.taskset, append([]string{"-c", cpuListString(p.server), bin}, args...)
}

// pinLoad moves every thread of this process (the load generator) to the
// load CPUs and sets GOMAXPROCS to their number. Threads the runtime starts
// later inherit the affinity of the thread that starts them. The returned
// function restores both.
func (p *placement) pinLoad() (restore func(), err error) {
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return nil, err
	}
	for _, c := range p.load {
		set.Set(c)
	}
	if err := setThreads(&set); err != nil {
		_ = setThreads(&old)
		return nil, err
	}
	procs := runtime.GOMAXPROCS(len(p.load))
	return func() {
		runtime.GOMAXPROCS(procs)
		_ = setThreads(&old)
	}, nil
}

// setThreads sets the affinity of every thread of this process, twice over
// in case one was started meanwhile by a thread not yet moved.
func setThreads(set *unix.CPUSet) error {
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			// A thread may have exited since the listing.
			if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("setting the CPUs of thread %d: %w", tid, err)
			}
		}
	}
	return nil
}

// String describes the placement for the report's environment line.
func (p *placement) String() string {
	return fmt.Sprintf("servers on CPU %s (taskset), load generator on CPU %s", cpuListString(p.server), cpuListString(p.load))
}
