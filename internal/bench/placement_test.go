package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{
		"1":          {1},
		"0,2":        {0, 2},
		"2-3":        {2, 3},
		" 3 , 0-1 ":  {0, 1, 3},
		"1,1,0-1":    {0, 1},
		"1023":       {1023},
		"5-5":        {5},
		"0-2,4,6-7":  {0, 1, 2, 4, 6, 7},
		"7,6,5,4,3,": nil, // trailing comma
	} {
		got, err := parseCPUList(in)
		if want == nil {
			if err == nil {
				t.Errorf("parseCPUList(%q) = %v, want an error", in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if got := cpuListString([]int{0, 1, 2, 4, 6, 7}); got != "0-2,4,6-7" {
		t.Errorf("cpuListString = %q, want the kernel's form 0-2,4,6-7", got)
	}
	for _, in := range []string{"", " ", "a", "-1", "1-", "-", "3-1", "1024", "0-1024", "1.5", "0x1", "1 2"} {
		if got, err := parseCPUList(in); err == nil {
			t.Errorf("parseCPUList(%q) = %v, want an error", in, got)
		}
	}
}

// FuzzParseCPUList: any input is parsed or refused without panicking, and a
// parsed list is sorted, unique, in range, and reads back the same.
func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"1", "0,2", "2-3", "0-1,4", "3-1", "", "1023", "0-1023", ",", "1--2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cpus, err := parseCPUList(s)
		if err != nil {
			return
		}
		if len(cpus) == 0 {
			t.Fatalf("parseCPUList(%q): no CPUs and no error", s)
		}
		for i, c := range cpus {
			if c < 0 || c >= maxCPUs || i > 0 && c <= cpus[i-1] {
				t.Fatalf("parseCPUList(%q) = %v: not sorted, unique CPUs in range", s, cpus)
			}
		}
		again, err := parseCPUList(cpuListString(cpus))
		if err != nil || !slices.Equal(again, cpus) {
			t.Fatalf("parseCPUList(%q) = %v, which reads back as %v, %v", s, cpus, again, err)
		}
	})
}

// allowedList is the Cpus_allowed_list of /proc/<pid>/status, or of one
// thread's status file.
func allowedList(t *testing.T, status string) string {
	t.Helper()
	b, err := os.ReadFile(status)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("%s has no Cpus_allowed_list", status)
	return ""
}

// TestPlacement: with server CPUs, a server starts on those CPUs only and
// every thread of the load generator moves to the others until restored.
// On a machine where this process may use one CPU, placing the servers
// there must be refused, since the load generator would have none.
func TestPlacement(t *testing.T) {
	allowed, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newPlacement(cpuListString(allowed)); err == nil || !strings.Contains(err.Error(), "no CPU is left for the load generator") {
		t.Fatalf("servers on every CPU: %v, want a refusal", err)
	}
	if _, err := newPlacement(fmt.Sprint(maxCPUs - 1)); err == nil || !strings.Contains(err.Error(), "is not one this process may use") {
		t.Fatalf("servers on CPU %d: %v, want a refusal", maxCPUs-1, err)
	}
	if _, err := Run(context.Background(), Config{Addr: "127.0.0.1:1", ServerCPUs: "0"}); err == nil || !strings.Contains(err.Error(), "not a running service") {
		t.Fatalf("server CPUs with --addr: %v, want a refusal", err)
	}
	if len(allowed) < 2 {
		return // the refusal above is all a one-CPU machine can show
	}
	server := allowed[len(allowed)-1:]
	pl, err := newPlacement(cpuListString(server))
	if err != nil {
		t.Fatal(err)
	}
	if want := cpuListString(allowed[:len(allowed)-1]); cpuListString(pl.load) != want {
		t.Fatalf("load CPUs %v, want %s", pl.load, want)
	}
	r, err := startRedisOn(pl, "redis-server", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	if got, want := allowedList(t, fmt.Sprintf("/proc/%d/status", r.cmd.Process.Pid)), cpuListString(server); got != want {
		t.Fatalf("redis-server runs on CPUs %s, want %s", got, want)
	}

	procs := runtime.GOMAXPROCS(0)
	before := allowedList(t, "/proc/self/status")
	restore, err := pl.pinLoad()
	if err != nil {
		t.Fatal(err)
	}
	threads := func() (lists []string) {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			lists = append(lists, allowedList(t, "/proc/self/task/"+task.Name()+"/status"))
		}
		return lists
	}
	pinned, gomaxprocs := threads(), runtime.GOMAXPROCS(0)
	restore()
	wantLoad := cpuListString(pl.load)
	for i, l := range pinned {
		if l != wantLoad {
			t.Fatalf("thread %d of %d pinned to %s, want %s", i, len(pinned), l, wantLoad)
		}
	}
	if gomaxprocs != len(pl.load) {
		t.Fatalf("GOMAXPROCS %d while pinned, want %d", gomaxprocs, len(pl.load))
	}
	if after := allowedList(t, "/proc/self/status"); after != before || runtime.GOMAXPROCS(0) != procs {
		t.Fatalf("after restore: CPUs %s and GOMAXPROCS %d, want %s and %d", after, runtime.GOMAXPROCS(0), before, procs)
	}
}
