package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

// TestBenchmarkSmoke runs the benchmark briefly against a service in this
// process, so `make test` proves it still works. It asserts that every call
// succeeded and what the numbers describe, never how fast anything was:
// the cycles in runs were steps of governed runs of RunSteps.
func TestBenchmarkSmoke(t *testing.T) {
	srv := redistest.Start(t)
	stack := servicetest.Start(t, srv.Client(t), servicetest.Options{SweepInterval: time.Hour, Policy: benchPolicy + runsPolicy})
	var out, log bytes.Buffer
	rep, err := Run(context.Background(), Config{
		Addr: stack.Addr, RedisAddr: srv.Addr,
		Concurrency: 4, Warmup: 50 * time.Millisecond, Duration: 200 * time.Millisecond,
		LatencyDuration: 100 * time.Millisecond, Rounds: 2, Preload: 50,
		Out: &out, Log: &log,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(rep.Throughput) != 7 || len(rep.Latency) != 3 {
		t.Fatalf("%d throughput and %d latency rows:\n%s", len(rep.Throughput), len(rep.Latency), out.String())
	}
	for _, s := range append(rep.Throughput, rep.Latency...) {
		if s.Calls == 0 || s.Rounds != 2 {
			t.Fatalf("%s: %d calls in %d rounds", s.Name, s.Calls, s.Rounds)
		}
	}
	for _, want := range []string{"health Check", "Reserve (new key)", reserveSHAName, "Reserve+Complete cycle", cycleRunsName, "Reserve (replay)", "Lookup", "p50 ÷ health"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("report without %q:\n%s", want, out.String())
		}
	}
	page, err := stack.Ledger.ListRuns(context.Background(), ledger.Principal{Tenant: server.DefaultTenant, ID: "bench-test"}, ledger.MaxRunPageSize, "")
	if err != nil {
		t.Fatal(err)
	}
	steps, full := 0, 0
	for _, r := range page.Runs {
		if r.Steps > RunSteps {
			t.Errorf("run %s: %d steps, want at most %d", r.ID, r.Steps, RunSteps)
		}
		if r.Steps == RunSteps {
			full++
		}
		steps += r.Steps
	}
	if runs := rep.Throughput[4]; full == 0 || int64(steps) < runs.Calls {
		t.Errorf("%d runs, %d of %d steps, %d steps in all; the scenario %q made %d cycles", len(page.Runs), full, RunSteps, steps, runs.Name, runs.Calls)
	}
}

// TestMCPSmoke runs the MCP part briefly: a ledgermcp process in front of
// the in-process tool server, every call answered without an error.
func TestMCPSmoke(t *testing.T) {
	srv := redistest.Start(t)
	stack := servicetest.Start(t, srv.Client(t), servicetest.Options{SweepInterval: time.Hour})
	var out, log bytes.Buffer
	rep, err := Run(context.Background(), Config{
		Addr: stack.Addr, RedisAddr: srv.Addr, Only: []string{"mcp"}, Ledgermcp: ledgertest.LedgermcpBinary(t, t.TempDir()),
		Concurrency: 4, Warmup: 20 * time.Millisecond, Duration: 100 * time.Millisecond,
		LatencyDuration: 100 * time.Millisecond, Rounds: 1, Dir: t.TempDir(),
		Out: &out, Log: &log,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(rep.MCP) != 5 || len(rep.MCPLatency) != 5 {
		t.Fatalf("%d and %d MCP rows:\n%s", len(rep.MCP), len(rep.MCPLatency), out.String())
	}
	for _, s := range append(rep.MCP, rep.MCPLatency...) {
		if s.Calls == 0 {
			t.Fatalf("%s: no calls", s.Name)
		}
	}
	for _, want := range []string{"tool called directly", "gateway: replay", "calls/s ÷ direct"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("report without %q:\n%s", want, out.String())
		}
	}
}

// TestOnlyChoosesScenarios: --only runs the scenarios it names and health
// Check; the fingerprint scenario runs at concurrency 1 only when named.
func TestOnlyChoosesScenarios(t *testing.T) {
	srv := redistest.Start(t)
	stack := servicetest.Start(t, srv.Client(t), servicetest.Options{SweepInterval: time.Hour})
	for _, c := range []struct {
		only           []string
		throughput, c1 []string
	}{
		{[]string{"latency"}, []string{"health Check"}, []string{"health Check", "Reserve (new key)"}},
		{[]string{"reserve-sha", "latency"}, []string{"health Check", reserveSHAName}, []string{"health Check", "Reserve (new key)", reserveSHAName}},
		{[]string{"lookup"}, []string{"health Check", "Lookup"}, nil},
		{[]string{"cycle-runs"}, []string{"health Check", cycleRunsName}, nil},
	} {
		var out, log bytes.Buffer
		rep, err := Run(context.Background(), Config{
			Addr: stack.Addr, RedisAddr: srv.Addr, Only: c.only,
			Concurrency: 2, Warmup: 10 * time.Millisecond, Duration: 50 * time.Millisecond,
			LatencyDuration: 50 * time.Millisecond, Rounds: 1, Preload: 10,
			Out: &out, Log: &log,
		})
		if err != nil {
			t.Fatalf("%v: %v\n%s", c.only, err, log.String())
		}
		names := func(sums []*Summary) (n []string) {
			for _, s := range sums {
				n = append(n, s.Name)
			}
			return n
		}
		if got := names(rep.Throughput); fmt.Sprint(got) != fmt.Sprint(c.throughput) {
			t.Errorf("--only %v: throughput %q, want %q", c.only, got, c.throughput)
		}
		if got := names(rep.Latency); fmt.Sprint(got) != fmt.Sprint(c.c1) {
			t.Errorf("--only %v: concurrency 1 %q, want %q", c.only, got, c.c1)
		}
	}
}

// TestMemorySmoke measures the memory of a few SUCCEEDED records on a fresh
// redis-server, and checks that each one takes one key: the record holds
// its history and, after its retention, its tombstone.
func TestMemorySmoke(t *testing.T) {
	srv := redistest.Start(t)
	svc := servicetest.Start(t, srv.Client(t), servicetest.Options{SweepInterval: time.Hour})
	c := Config{Concurrency: 8, Log: &bytes.Buffer{}}
	c.defaults()
	m, err := c.fill(context.Background(), &stack{addr: svc.Addr, rdbAddr: srv.Addr}, 200, "m")
	if err != nil {
		t.Fatal(err)
	}
	if m.KeysPerRecord != 1 || m.After <= m.Before || !strings.HasPrefix(m.SampleKeyUsage, "op ") {
		t.Fatalf("memory = %+v; want one key per record", m)
	}
}

// TestDurableRedis: with DurableRedis the benchmark's redis-servers run
// with the production settings, without it with no persistence.
func TestDurableRedis(t *testing.T) {
	for _, durable := range []bool{false, true} {
		c := Config{DurableRedis: durable}
		r, err := StartRedis("redis-server", t.TempDir(), c.redisArgs()...)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := DialRedis(r.Addr)
		if err != nil {
			r.Stop()
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, name := range []string{"appendonly", "appendfsync"} {
			v, err := conn.Do("CONFIG", "GET", name)
			if l, ok := v.([]any); err == nil && ok && len(l) == 2 {
				got[name] = fmt.Sprint(l[1])
			} else {
				t.Errorf("CONFIG GET %s = %v, %v", name, v, err)
			}
		}
		conn.Close()
		r.Stop()
		if want := map[bool]string{false: "no", true: "yes"}[durable]; got["appendonly"] != want {
			t.Errorf("durable=%v: appendonly %q, want %q", durable, got["appendonly"], want)
		}
		if durable && got["appendfsync"] != "always" {
			t.Errorf("durable: appendfsync %q, want always", got["appendfsync"])
		}
	}
}

// TestOnFreePort: a redis-server that finds its port taken, by a silent
// listener or by another redis-server, is started again on another port;
// any other failure is not retried.
func TestOnFreePort(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	other := redistest.Start(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(redistest.MissingMessage)
	}
	for _, taken := range []string{silent.Addr().String(), other.Addr} {
		var tried []string
		r, err := onFreePort(func(addr string) (*Process, error) {
			tried = append(tried, addr)
			if len(tried) == 1 {
				addr = taken
			}
			return startRedis(nil, nil, bin, addr, t.TempDir(), nil)
		})
		if err != nil || len(tried) != 2 {
			t.Fatalf("onFreePort after %s was taken: %v, %d tries", taken, err, len(tried))
		}
		if pid, err := redisPID(r.Addr); err != nil || pid != r.cmd.Process.Pid {
			t.Fatalf("the Redis at %s is pid %d (%v), not the one started (%d)", r.Addr, pid, err, r.cmd.Process.Pid)
		}
		r.Stop()
	}

	var tried []string
	_, err = onFreePort(func(addr string) (*Process, error) {
		tried = append(tried, addr)
		return nil, errors.New("redis-server exited: unknown option")
	})
	if err == nil || len(tried) != 1 {
		t.Fatalf("onFreePort after another failure: %v, %d tries", err, len(tried))
	}
}
