// Command ledgerbench measures the operation ledger: it starts ledgerd on a
// fresh redis-server and drives it over gRPC at 50 concurrent calls by
// default, against a health Check in the same run (absolute numbers drift,
// ratios hold): Reserve, Reserve+Complete, replays and Lookup; the bare
// server's floor of one Redis round trip, and ledgerd beside it at once;
// memory per record; with --growth, throughput with many records stored;
// with --ledgermcp, the MCP gateway's cost; the Reserve+Complete cycle
// against the same cycle in-process with github.com/faustbrian/go-idempotency
// (--peer-src when the Go module proxy does not serve it); with --against,
// two ledgerd binaries side by side under the same load. It asserts no
// timing; it fails when a call failed.
// `make bench` builds ledgerd and runs it; docs/benchmarks.md explains the
// numbers.
//
//	ledgerbench --ledgerd bin/ledgerd [--duration 10s] [--concurrency 50]
//	ledgerbench --ledgerd bin/ledgerd --against /tmp/ledgerd-old --only pair
//	ledgerbench --addr 127.0.0.1:50051 --redis-addr 127.0.0.1:6379   # a running service
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/opledger/ledger/internal/bench"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == bench.BareCommand || os.Args[1] == bench.CycleCommand) {
		// A process the benchmark starts: the bare server or the ledger's
		// in-process cycler.
		if err := child(os.Args[1], os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "ledgerbench %s: %v\n", os.Args[1], err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ledgerbench:", err)
		var u *usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// child runs the command the benchmark started this binary with.
func child(name string, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if name == bench.CycleCommand {
		return bench.CycleMain(ctx, args, os.Stdout)
	}
	return bench.BareMain(ctx, args)
}

// usageError is a command line ledgerbench refuses before it starts
// anything: main exits 2 for it, as the flag package does.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usagef returns a usageError.
func usagef(format string, a ...any) error { return &usageError{fmt.Errorf(format, a...)} }

// run runs the benchmark the command line args asks for, its report on
// stdout and its progress on stderr.
func run(args []string, stdout, stderr io.Writer) error {
	c, err := parse(args, stderr)
	if c == nil || err != nil {
		return err
	}
	c.Out = stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err = bench.Run(ctx, *c)
	return err
}

// scenarios are the names --only takes.
var scenarios = []string{"reserve", "reserve-sha", "cycle", "cycle-runs", "replay", "lookup", "latency", "bare", "bare-ledger",
	bench.BarePairKey, "mcp", "receipts", "functions", "peer", bench.InstructionsKey, "pair"}

// parse reads the command line into a configuration, with this binary as
// the cycler and the bare server. It returns nil and a nil error for -h,
// and a usageError for what it refuses.
func parse(args []string, stderr io.Writer) (*bench.Config, error) {
	var c bench.Config
	fs := flag.NewFlagSet("ledgerbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Ledgerd, "ledgerd", "", "the ledgerd binary to start on fresh redis-servers (make bench builds bin/ledgerd)")
	fs.StringVar(&c.RedisServer, "redis-server", "redis-server", "the redis-server binary")
	fs.StringVar(&c.Ledgermcp, "ledgermcp", "", "the ledgermcp binary: also measure a tool called directly and through the MCP gateway (make bench builds bin/ledgermcp)")
	fs.StringVar(&c.Addr, "addr", "", "drive an already running ledgerd at this address instead: throughput and latency only (no bare server, memory or growth part, which start servers of their own)")
	fs.StringVar(&c.RedisAddr, "redis-addr", "", "the Redis of --addr, for the environment line")
	fs.IntVar(&c.Concurrency, "concurrency", 50, "concurrent calls of the throughput runs")
	fs.IntVar(&c.Conns, "connections", 1, "HTTP/2 connections to ledgerd")
	fs.DurationVar(&c.Warmup, "warmup", 2e9, "unmeasured calls before each measured window")
	fs.DurationVar(&c.Duration, "duration", 10e9, "measured window of each throughput run")
	fs.DurationVar(&c.LatencyDuration, "latency-duration", 5e9, "measured window of each concurrency-1 run")
	fs.IntVar(&c.Rounds, "rounds", 3, "rounds of every throughput and latency run; the report shows medians")
	fs.Int64Var(&c.Preload, "preload", 10000, "completed operations the replay and Lookup runs read")
	fs.BoolVar(&c.NoThroughput, "no-throughput", false, "skip the throughput part (memory and growth only)")
	fs.Int64Var(&c.MemoryRecords, "memory-records", 100000, "SUCCEEDED records of the memory measurement (0: skip)")
	growth := fs.String("growth", "", "comma-separated store sizes for the growth measurement, e.g. 1000,1000000 (empty: skip)")
	only := fs.String("only", "", "comma-separated throughput scenarios to run: "+strings.Join(scenarios, ", ")+" (health always runs; empty: all)")
	fs.StringVar(&c.Against, "against", "", "a second ledgerd binary: also run it and --ledgerd at once, each on a fresh redis-server, under the same load, and compare their CPU per call (the pair part)")
	ledgerdFlags := fs.String("ledgerd-flags", "", "extra ledgerd flags, space-separated")
	fs.BoolVar(&c.DurableRedis, "redis-durable", false, "start redis-server with appendonly yes and appendfsync always (the production settings of docs/operations.md) instead of without persistence")
	fs.StringVar(&c.ServerCPUs, "server-cpus", "", "CPU list (taskset -c form, e.g. 1 or 2-3): run redis-server, ledgerd and the bare servers on these CPUs only and the load generator on the others, as when the agents run elsewhere (docs/benchmarks.md, sections 3.10 and 5.2); empty: every process on every CPU")
	bare := fs.Bool("bare", true, "also measure the bare server (health Check with one EVALSHA per call, same Redis client): the floor of one Redis round trip per call; its ledger variant (one ledger.Reserve per call); and the bare pair part (ledgerd and the bare server at once)")
	fs.StringVar(&c.PeerModule, "peer-module", "internal/bench/peer", "the directory of the peer's cycler module, which the peer part builds (the path from the repository's root)")
	fs.StringVar(&c.PeerSource, "peer-src", "", "a source tree of github.com/faustbrian/go-idempotency to build the peer from instead of the Go module proxy's")
	fs.StringVar(&c.Go, "go", "go", "the go command that builds the peer")
	fs.Int64Var(&c.InstructionCycles, "instruction-cycles", 3000, "the cycles the instructions part counts Redis's instructions over, per way (under callgrind, about 2 ms each)")
	fs.StringVar(&c.Dir, "dir", "", "scratch directory, kept afterwards (ledgerd logs, Redis files); a temporary one when empty")
	verbose := fs.Bool("v", true, "progress on stderr")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return nil, nil
		}
		return nil, &usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected arguments: %v", fs.Args())
	}
	var err error
	if c.Growth, err = parseGrowth(*growth); err != nil {
		return nil, err
	}
	if c.Only, err = parseOnly(*only); err != nil {
		return nil, err
	}
	if c.Cycler, err = os.Executable(); err != nil {
		return nil, err
	}
	if *bare {
		c.BareServer = c.Cycler
	}
	c.LedgerdFlags = strings.Fields(*ledgerdFlags)
	if *verbose {
		c.Log = stderr
	}
	return &c, check(&c)
}

// check refuses flags that do not go together.
func check(c *bench.Config) error {
	switch {
	case c.Ledgerd == "" && c.Addr == "":
		return usagef("--ledgerd BINARY (make bench builds bin/ledgerd) or --addr HOST:PORT (a running ledgerd) is required")
	case c.ServerCPUs != "" && c.Addr != "":
		return usagef("--server-cpus places the servers ledgerbench starts: it does not go with --addr (a running ledgerd)")
	case c.InstructionCycles <= 0:
		return usagef("--instruction-cycles %d: want a positive count", c.InstructionCycles)
	case slices.Contains(c.Only, "pair") && c.Against == "":
		return usagef("--only pair: needs --against, the second ledgerd binary")
	case slices.Contains(c.Only, bench.BarePairKey) && c.BareServer == "":
		return usagef("--only %s: needs the bare server (drop --bare=false)", bench.BarePairKey)
	}
	return nil
}

// parseGrowth reads --growth: comma-separated positive record counts.
func parseGrowth(list string) ([]int64, error) {
	var ns []int64
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return nil, usagef("--growth %q: want positive record counts", list)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// parseOnly reads --only: comma-separated scenario names.
func parseOnly(list string) ([]string, error) {
	var only []string
	for _, s := range strings.Split(list, ",") {
		switch s = strings.TrimSpace(s); {
		case s == "":
		case slices.Contains(scenarios, s):
			only = append(only, s)
		default:
			return nil, usagef("--only %q: want %s or %s", s, strings.Join(scenarios[:len(scenarios)-1], ", "), scenarios[len(scenarios)-1])
		}
	}
	return only, nil
}
