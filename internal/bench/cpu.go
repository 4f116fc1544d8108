package bench

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on
// Linux everywhere that matters).
const clockTick = 10 * time.Millisecond

// cpuOf returns the CPU time (user + system) a process has used so far, 0
// when it cannot be read (not Linux, or the process is gone).
func cpuOf(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; the rest follows its ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * clockTick
}

// selfCPU returns the CPU time this process (the load generator) has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// CPU is the CPU time each process spent per call of a run's measured
// window; zero for a process the benchmark did not start.
type CPU struct {
	Client, Ledgerd, Redis time.Duration
	// Gateway is the MCP gateway's, in the MCP part.
	Gateway time.Duration
}

// cpuMeter samples the CPU counters of the processes.
type cpuMeter struct {
	ledgerd, redis, gateway int // pids, 0 when unknown
	at                      [4]time.Duration
	used                    [4]time.Duration
}

func (m *cpuMeter) sample() [4]time.Duration {
	var s [4]time.Duration
	s[0] = selfCPU()
	for i, pid := range []int{m.ledgerd, m.redis, m.gateway} {
		if pid > 0 {
			s[i+1] = cpuOf(pid)
		}
	}
	return s
}

// window is a Spec.Window that records the CPU used inside the window.
func (m *cpuMeter) window(start bool) {
	s := m.sample()
	if start {
		m.at = s
		return
	}
	for i := range s {
		m.used[i] = s[i] - m.at[i]
	}
}

func (m *cpuMeter) perCall(calls int64) CPU {
	if calls <= 0 {
		return CPU{}
	}
	per := func(i int) time.Duration { return m.used[i] / time.Duration(calls) }
	c := CPU{Client: per(0)}
	if m.ledgerd > 0 {
		c.Ledgerd = per(1)
	}
	if m.redis > 0 {
		c.Redis = per(2)
	}
	if m.gateway > 0 {
		c.Gateway = per(3)
	}
	return c
}
