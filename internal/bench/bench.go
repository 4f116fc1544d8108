package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/opledger/ledger/ledger"
	"github.com/redis/go-redis/v9"
)

// Config configures a whole benchmark.
type Config struct {
	// Ledgerd is the ledgerd binary to start (on a fresh redis-server for
	// every part of the benchmark). Required unless Addr is set.
	Ledgerd string
	// RedisServer is the redis-server binary ("redis-server" on PATH when
	// empty).
	RedisServer string
	// Addr and RedisAddr name a service that is already running, and its
	// store, instead: only the throughput part runs (it adds records).
	Addr, RedisAddr string
	// LedgerdFlags are extra ledgerd flags (e.g. --log-level).
	LedgerdFlags []string
	// DurableRedis starts every redis-server with the settings
	// docs/operations.md requires in production (appendonly yes,
	// appendfsync always: every write reaches the disk before its reply)
	// instead of without persistence.
	DurableRedis bool
	// BareServer is a binary that runs the bare server (ServeBare) when
	// given BareCommand: cmd/ledgerbench itself. When set (and Addr is not),
	// the throughput part also measures the bare server's Check, with one
	// EVALSHA per call, at both concurrencies: the floor of one Redis round
	// trip per call on this machine; and its ledger variant's, with one
	// ledger.Reserve per call.
	BareServer string
	// PeerModule is the directory of the peer's cycler module
	// (internal/bench/peer); the peer part builds it with the go command Go
	// ("go" when empty). PeerSource, when set, is a source tree of the
	// peer's module to build it from instead of the module proxy's.
	PeerModule, PeerSource, Go string
	// Against is a second ledgerd binary: when set, the pair part runs
	// Ledgerd and Against at once, each on a Redis of its own, and
	// compares their CPU per call (Pair).
	Against string
	// Cycler is a binary that runs the ledger's cycler (RunCycle) when
	// given CycleCommand: cmd/ledgerbench itself. The peer part needs it.
	Cycler string
	// Ledgermcp is the ledgermcp binary: when set, the MCP part measures a
	// tool called directly and through the gateway (with Addr too).
	Ledgermcp string
	// ServerCPUs, when set, is a CPU list in taskset's form ("1", "2-3"):
	// the servers the benchmark starts (redis-server, ledgerd, the bare
	// servers) run on those CPUs only, under taskset, and the load
	// generator on the CPUs left. Empty: every process may use every CPU.
	ServerCPUs string

	Concurrency int           // concurrent calls of the throughput runs (50)
	Conns       int           // HTTP/2 connections to the service (1)
	Warmup      time.Duration // before each measured window (1s)
	Duration    time.Duration // each measured window at Concurrency (10s)
	// LatencyDuration is the window of the concurrency-1 runs (5s).
	LatencyDuration time.Duration
	// Rounds is how many times every throughput and latency run is
	// repeated (3); the report shows medians.
	Rounds int
	// Preload is how many completed operations the replay and Lookup runs
	// draw from (10000).
	Preload int64
	// MemoryRecords is how many SUCCEEDED records the memory part creates
	// (100000; 0 skips it).
	MemoryRecords int64
	// ReceiptRecords is how many SUCCEEDED records the receipts part
	// stores on each of its stacks (20000).
	ReceiptRecords int64
	// InstructionCycles is how many cycles the instructions part counts
	// Redis's instructions over, per way (3000).
	InstructionCycles int64
	// Growth lists the store sizes (SUCCEEDED records) at which Reserve
	// throughput and memory are measured again (none: skipped).
	Growth []int64

	// NoThroughput skips the throughput part (for a memory or growth run).
	NoThroughput bool
	// Only, when set, restricts the throughput part to the scenarios whose
	// key (reserve, cycle, replay, lookup, latency, bare, bare-ledger, mcp,
	// receipts, functions, peer, instructions, pair) it lists; health Check always runs, and at concurrency 1 so does
	// Reserve.
	Only []string

	pids [2]int   // ledgerd and redis-server of the current stack, when started here
	peer struct { // the peer's cycler, once built (peerBinary)
		bin   string
		err   error
		built bool
	}
	placement *placement // from ServerCPUs; nil: no placement

	// Dir is the scratch directory (a temporary one when empty).
	Dir string
	// Out receives the report; Log receives progress lines (nil: none).
	Out, Log io.Writer
}

func (c *Config) defaults() {
	if c.Concurrency <= 0 {
		c.Concurrency = 50
	}
	if c.Conns <= 0 {
		c.Conns = 1
	}
	if c.Warmup < 0 {
		c.Warmup = 0
	}
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.LatencyDuration <= 0 {
		c.LatencyDuration = 5 * time.Second
	}
	if c.Rounds <= 0 {
		c.Rounds = 3
	}
	if c.Preload <= 0 {
		c.Preload = 10000
	}
	if c.ReceiptRecords <= 0 {
		c.ReceiptRecords = 20000
	}
	if c.InstructionCycles <= 0 {
		c.InstructionCycles = 3000
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
}

// benchPolicy gives claims a lease longer than the benchmark, so no lease
// expires (and no sweeper work starts) while it runs; everything else is the
// default policy.
const benchPolicy = "defaults:\n  lease: 1h\n"

// Report is everything one benchmark measured.
type Report struct {
	Env        string
	Throughput []*Summary // at Concurrency; [0] is health Check
	Latency    []*Summary // at concurrency 1; [0] is health Check
	Memory     *Memory
	Growth     []GrowthPoint
	// MCP and MCPLatency are the MCP part, at Concurrency and at 1; [0]
	// is the tool called directly.
	MCP, MCPLatency []*Summary
	// Receipts is the receipts part.
	Receipts *Receipts
	// Functions is the functions part.
	Functions *Functions
	// Peer is the peer part.
	Peer *Peer
	// Instructions is the instructions part.
	Instructions *Instructions
	// Pair is the pair part (with Config.Against).
	Pair *Pair
	// BarePair is the bare pair part (with Config.BareServer).
	BarePair *BarePair
}

// Memory is the store's memory per SUCCEEDED record.
type Memory struct {
	Records        int64
	Before, After  int64   // used_memory minus client buffers
	PerRecord      float64 // (After-Before)/Records
	KeysPerRecord  float64
	SampleKeyUsage string // MEMORY USAGE of one record's keys
}

// GrowthPoint is Reserve throughput and memory with Records stored.
type GrowthPoint struct {
	Records   int64
	PerRecord float64
	Health    *Summary
	Reserve   *Summary
}

// stack is one fresh redis-server with ledgerd on it.
type stack struct {
	redis, ledgerd *Process
	addr, rdbAddr  string
}

func (s *stack) pids() (ledgerd, redis int) {
	if s == nil {
		return 0, 0
	}
	return s.ledgerd.cmd.Process.Pid, s.redis.cmd.Process.Pid
}

func (s *stack) stop() {
	if s == nil {
		return
	}
	s.ledgerd.Stop()
	s.redis.Stop()
}

// redisArgs are the redis-server flags of every stack beyond StartRedis's.
func (c *Config) redisArgs() []string {
	if c.DurableRedis {
		return []string{"--appendonly", "yes", "--appendfsync", "always"}
	}
	return nil
}

// startStack starts a fresh redis-server and a ledgerd on it with policy
// and, after c.LedgerdFlags, the extra flags.
func (c *Config) startStack(name string, policy string, extra ...string) (*stack, error) {
	return c.startStackOf(c.Ledgerd, name, policy, extra...)
}

// startRedisIn starts a fresh redis-server with its files in c.Dir/name,
// and returns it with that directory.
func (c *Config) startRedisIn(name string) (*Process, string, error) {
	dir := filepath.Join(c.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	r, err := startRedisOn(c.placement, c.RedisServer, dir, c.redisArgs())
	return r, dir, err
}

// startStackOf is startStack with the ledgerd binary bin.
func (c *Config) startStackOf(bin, name string, policy string, extra ...string) (*stack, error) {
	r, dir, err := c.startRedisIn(name)
	if err != nil {
		return nil, err
	}
	// A huge unresolved limit instead of none, so the check still runs.
	flags := []string{"--max-unresolved", "1000000000", "--log-level", "warn"}
	if policy != "" {
		p := filepath.Join(dir, "policy.yaml")
		if err := os.WriteFile(p, []byte(policy), 0o644); err != nil {
			r.Stop()
			return nil, err
		}
		flags = append(flags, "--policy", p)
	}
	flags = append(append(flags, c.LedgerdFlags...), extra...)
	l, err := startLedgerdOn(c.placement, bin, r.Addr, filepath.Join(dir, "ledgerd.log"), flags)
	if err != nil {
		r.Stop()
		return nil, err
	}
	return &stack{redis: r, ledgerd: l, addr: l.Addr, rdbAddr: r.Addr}, nil
}

// Run runs the benchmark and writes its report to c.Out. It fails when any
// call failed.
func Run(ctx context.Context, c Config) (*Report, error) {
	c.defaults()
	if c.Addr == "" && c.Ledgerd == "" {
		return nil, errors.New("bench: the ledgerd binary (or the address of a running service) is required")
	}
	if c.ServerCPUs != "" {
		restore, err := c.place()
		if err != nil {
			return nil, err
		}
		defer restore()
	}
	if c.Dir == "" {
		dir, err := os.MkdirTemp("", "ledgerbench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		c.Dir = dir
	}
	rep := &Report{}
	addr, rdbAddr := c.Addr, c.RedisAddr
	if addr == "" {
		s, err := c.startStack("throughput", benchPolicy+runsPolicy)
		if err != nil {
			return nil, err
		}
		defer s.stop()
		addr, rdbAddr = s.addr, s.rdbAddr
		c.pids[0], c.pids[1] = s.pids()
	}
	rep.Env = environment(rdbAddr)
	if c.placement != nil {
		rep.Env += "; " + c.placement.String()
	}
	fmt.Fprintln(c.Out, rep.Env)
	if !c.NoThroughput {
		if err := c.throughputParts(ctx, rep, addr, rdbAddr); err != nil {
			return rep, err
		}
	}
	if err := c.ownParts(ctx, rep); err != nil {
		return rep, err
	}
	c.printGoals(rep)
	return rep, nil
}

// place pins the load generator to the CPUs c.ServerCPUs leaves it, and
// returns what undoes that.
func (c *Config) place() (restore func(), err error) {
	if c.Addr != "" {
		return nil, errors.New("bench: server CPUs place the servers the benchmark starts, not a running service (--addr)")
	}
	pl, err := newPlacement(c.ServerCPUs)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	restore, err = pl.pinLoad()
	if err != nil {
		return nil, fmt.Errorf("bench: placing the load generator: %w", err)
	}
	c.placement = pl
	return restore, nil
}

// throughputParts runs the scenarios against the service at addr (and the
// bare servers, started on the Redis at rdbAddr), then the MCP part.
func (c *Config) throughputParts(ctx context.Context, rep *Report, addr, rdbAddr string) error {
	var bare [2]*Process // the bare server and its ledger variant
	if c.Addr == "" && c.BareServer != "" {
		for i, v := range bareVariants {
			if !c.selected(v.key) {
				continue
			}
			b, err := c.startBare(rdbAddr, i == 1)
			if err != nil {
				return err
			}
			defer b.Stop()
			bare[i] = b
		}
	}
	if err := c.throughput(ctx, rep, addr, bare); err != nil {
		return err
	}
	c.printThroughput(rep)
	if c.Ledgermcp != "" && c.selected("mcp") {
		if err := c.mcpPart(ctx, rep, addr); err != nil {
			return err
		}
		c.printMCP(rep)
	}
	return nil
}

// ownParts runs the parts that start servers of their own, those selected,
// in the report's order.
func (c *Config) ownParts(ctx context.Context, rep *Report) error {
	if c.Addr != "" {
		return nil
	}
	on := !c.NoThroughput
	for _, p := range []struct {
		want bool
		run  func() error
	}{
		{on && c.selected("receipts"), func() error { return measure(ctx, c.receiptsPart, &rep.Receipts, c.printReceipts) }},
		{on && c.selected("functions"), func() error { return measure(ctx, c.functionsPart, &rep.Functions, c.printFunctions) }},
		{on && c.Cycler != "" && c.selected("peer"), func() error { return measure(ctx, c.peerPart, &rep.Peer, c.printPeer) }},
		{on && c.Cycler != "" && c.selected(InstructionsKey), func() error {
			return measure(ctx, c.instructionsPart, &rep.Instructions, c.printInstructions)
		}},
		{on && c.BareServer != "" && c.selected(BarePairKey), func() error { return measure(ctx, c.barePairPart, &rep.BarePair, c.printBarePair) }},
		{on && c.Against != "" && c.selected("pair"), func() error { return measure(ctx, c.pairPart, &rep.Pair, c.printPair) }},
		{c.MemoryRecords > 0, func() error { return measure(ctx, c.memory, &rep.Memory, c.printMemory) }},
		{len(c.Growth) > 0, func() error { return c.growthPart(ctx, rep) }},
	} {
		if !p.want {
			continue
		}
		if err := p.run(); err != nil {
			return err
		}
	}
	return nil
}

// measure runs a part, keeps what it measured in *dst and prints it.
func measure[T any](ctx context.Context, part func(context.Context) (T, error), dst *T, print func(T)) error {
	v, err := part(ctx)
	if err != nil {
		return err
	}
	*dst = v
	print(v)
	return nil
}

// growthPart measures every store size of c.Growth.
func (c *Config) growthPart(ctx context.Context, rep *Report) error {
	for _, n := range c.Growth {
		g, err := c.growth(ctx, n)
		if err != nil {
			return err
		}
		rep.Growth = append(rep.Growth, g)
	}
	c.printGrowth(rep.Growth)
	return nil
}

func (c *Config) run(ctx context.Context, spec Spec, call Call) (*Result, error) {
	return c.runOn(ctx, c.pids[0], spec, call)
}

// runOn is run with the CPU of the server process pid counted in the
// ledgerd column.
func (c *Config) runOn(ctx context.Context, pid int, spec Spec, call Call) (*Result, error) {
	fmt.Fprintf(c.Log, "  %s at concurrency %d ...\n", spec.Name, spec.Concurrency)
	m := &cpuMeter{ledgerd: pid, redis: c.pids[1]}
	spec.Window = m.window
	r := Drive(ctx, spec, call)
	r.CPU = m.perCall(r.Calls)
	if r.Errors > 0 {
		return r, fmt.Errorf("%s: %d of %d calls failed; the first: %v", spec.Name, r.Errors, r.Errors+r.Calls, r.FirstErr)
	}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	return r, nil
}

// throughput runs the selected scenarios against the service at addr and
// the bare servers, in c.Rounds rounds, at c.Concurrency and at 1.
func (c *Config) throughput(ctx context.Context, rep *Report, addr string, bareServers [2]*Process) error {
	t, err := Dial(addr, c.Conns)
	if err != nil {
		return err
	}
	defer t.Close()
	var bare [2]*Target
	for i, b := range bareServers {
		if b == nil {
			continue
		}
		if bare[i], err = Dial(b.Addr, c.Conns); err != nil {
			return err
		}
		defer bare[i].Close()
	}
	run := RunID()
	fmt.Fprintln(c.Log, "throughput:")
	// The operations the replay and Lookup runs read.
	if c.selected("replay") || c.selected("lookup") {
		if _, err := c.run(ctx, Spec{Name: "preload", Concurrency: c.Concurrency, Count: c.Preload, RPCs: 2}, t.Cycle(run+"p")); err != nil {
			return err
		}
	}
	phases, latency := c.phases(t, run, bare, bareServers)
	var tp, lat [][]*Result // [phase][round]
	// At concurrency 1: health Check and Reserve, and every other scenario
	// selected that has a concurrency-1 run.
	atC1 := func(key string) bool { return key == "reserve" || c.selected(key) }
	for round := range c.Rounds {
		if c.Rounds > 1 {
			fmt.Fprintf(c.Log, " round %d of %d\n", round+1, c.Rounds)
		}
		r := strconv.Itoa(round)
		if err := c.runPhases(ctx, phases, r, &tp, c.selected); err != nil {
			return err
		}
		if c.selected("latency") {
			if err := c.runPhases(ctx, latency, r, &lat, atC1); err != nil {
				return err
			}
		}
	}
	rep.Throughput = summarize(tp)
	rep.Latency = summarize(lat)
	return nil
}

// phase is one scenario of the throughput part.
type phase struct {
	key  string
	spec Spec
	call func(round string) Call
	pid  int // the server's process, when not ledgerd
}

// phases returns the scenarios on t, the ledger, with ids under run, and on
// the bare servers there are: at c.Concurrency, and at 1.
func (c *Config) phases(t *Target, run string, bare [2]*Target, bareServers [2]*Process) (tp, latency []phase) {
	window := func(name string, conc int, d time.Duration, rpcs int) Spec {
		return Spec{Name: name, Concurrency: conc, Warmup: c.Warmup, Duration: d, RPCs: rpcs}
	}
	tp = []phase{
		{"health", window("health Check", c.Concurrency, c.Duration, 1), func(string) Call { return t.Health() }, 0},
		{"reserve", window(reserveName, c.Concurrency, c.Duration, 1), func(r string) Call { return t.ReserveNew(run + "n" + r) }, 0},
		{"reserve-sha", window(reserveSHAName, c.Concurrency, c.Duration, 1), func(r string) Call { return t.ReserveNewFingerprint(run + "f" + r) }, 0},
		{"cycle", window(cycleName, c.Concurrency, c.Duration, 2), func(r string) Call { return t.Cycle(run + "c" + r) }, 0},
		{"cycle-runs", window(cycleRunsName, c.Concurrency, c.Duration, 2), func(r string) Call { return t.CycleInRuns(run+"r"+r, RunSteps) }, 0},
		{"replay", window("Reserve (replay)", c.Concurrency, c.Duration, 1), func(string) Call { return t.Replay(run+"p", c.Preload) }, 0},
		{"lookup", window("Lookup", c.Concurrency, c.Duration, 1), func(string) Call { return t.Lookup(run+"p", c.Preload) }, 0},
	}
	latency = []phase{
		{"health", window("health Check", 1, c.LatencyDuration, 1), func(string) Call { return t.Health() }, 0},
		{"reserve", window(reserveName, 1, c.LatencyDuration, 1), func(r string) Call { return t.ReserveNew(run + "l" + r) }, 0},
		{"reserve-sha", window(reserveSHAName, 1, c.LatencyDuration, 1), func(r string) Call { return t.ReserveNewFingerprint(run + "g" + r) }, 0},
	}
	for i, v := range bareVariants {
		if bare[i] == nil { // not selected
			continue
		}
		health, pid := bare[i].Health, bareServers[i].cmd.Process.Pid
		tp = append(tp, phase{v.key, window(v.name, c.Concurrency, c.Duration, 1), func(string) Call { return health() }, pid})
		latency = append(latency, phase{v.key, window(v.name, 1, c.LatencyDuration, 1), func(string) Call { return health() }, pid})
	}
	return tp, latency
}

// runPhases runs round r of the phases want takes, appending each result
// to its phase's row of out.
func (c *Config) runPhases(ctx context.Context, phases []phase, r string, out *[][]*Result, want func(key string) bool) error {
	i := 0
	for _, p := range phases {
		if !want(p.key) {
			continue
		}
		res, err := c.runOn(ctx, cmp.Or(p.pid, c.pids[0]), p.spec, p.call(r))
		if err != nil {
			return err
		}
		if len(*out) == i {
			*out = append(*out, nil)
		}
		(*out)[i] = append((*out)[i], res)
		i++
	}
	return nil
}

// reserveName and cycleName are the new-key Reserve's and the
// Reserve+Complete cycle's scenarios in the report.
const (
	reserveName = "Reserve (new key)"
	cycleName   = "Reserve+Complete cycle"
)

// cycleRunsName is the cycle's scenario with each operation a step of a
// run of RunSteps, governed by the stack's policy (runsPolicy).
var cycleRunsName = fmt.Sprintf("Reserve+Complete cycle in runs of %d", RunSteps)

// reserveSHAName is the scenario of a client that sends the parameters'
// fingerprint (params_sha256) instead of the parameters. It also runs at
// concurrency 1 when latency runs, unless --only leaves it out.
const reserveSHAName = "Reserve (new key, params_sha256)"

func (c *Config) selected(key string) bool {
	return key == "health" || len(c.Only) == 0 || slices.Contains(c.Only, key)
}

// storeMemory is used_memory without the clients' buffers, which depend on
// how many connections ledgerd holds, not on what is stored.
func storeMemory(addr string) (int64, error) {
	r, err := DialRedis(addr)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	m, err := r.Info("memory")
	if err != nil {
		return 0, err
	}
	used, err1 := strconv.ParseInt(m["used_memory"], 10, 64)
	clients, err2 := strconv.ParseInt(m["mem_clients_normal"], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("INFO memory: %w", err)
	}
	return used - clients, nil
}

// fill creates n SUCCEEDED records with ResultBytes results through the
// service at s and returns the store memory they take per record.
func (c *Config) fill(ctx context.Context, s *stack, n int64, prefix string) (*Memory, error) {
	t, err := Dial(s.addr, c.Conns)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	before, err := storeMemory(s.rdbAddr)
	if err != nil {
		return nil, err
	}
	conc := max(c.Concurrency, 100)
	if _, err := c.run(ctx, Spec{Name: fmt.Sprintf("%d Reserve+Complete cycles", n), Concurrency: conc, Count: n, RPCs: 2}, t.Cycle(prefix)); err != nil {
		return nil, err
	}
	// The live counts at 0 stay until the sweeper prunes them, once a
	// minute: the store is measured as it holds the records after that.
	if err := pruneCounts(ctx, s.rdbAddr); err != nil {
		return nil, err
	}
	r, err := DialRedis(s.rdbAddr)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	keys, err := r.Do("DBSIZE")
	if err != nil {
		return nil, err
	}
	after, err := storeMemory(s.rdbAddr)
	if err != nil {
		return nil, err
	}
	m := &Memory{Records: n, Before: before, After: after, PerRecord: float64(after-before) / float64(n)}
	if k, ok := keys.(int64); ok {
		m.KeysPerRecord = float64(k) / float64(n)
	}
	// What one record's keys take, as Redis accounts them.
	var parts []string
	id := encodeComponent(OperationID(prefix, 1))
	for _, kind := range []string{"op", "h", "tomb"} {
		pattern := fmt.Sprintf("ledger:{s*}:%s:default:%s", kind, id)
		v, err := r.Do("KEYS", pattern)
		if err != nil {
			return nil, err
		}
		names, _ := v.([]any)
		for _, name := range names {
			s, _ := name.(string)
			u, err := r.Do("MEMORY", "USAGE", s, "SAMPLES", "0")
			if err == nil {
				parts = append(parts, fmt.Sprintf("%s %v B", kind, u))
			}
		}
	}
	m.SampleKeyUsage = strings.Join(parts, ", ")
	return m, nil
}

// pruneCounts deletes the live counts at 0 in the store at addr (default
// prefix), as ledgerd's sweeper does.
func pruneCounts(ctx context.Context, addr string) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer rdb.Close()
	l, err := ledger.New(rdb, ledger.Options{})
	if err != nil {
		return err
	}
	_, err = l.PruneCounts(ctx)
	return err
}

func (c *Config) memory(ctx context.Context) (*Memory, error) {
	fmt.Fprintln(c.Log, "memory:")
	// The default policy: 7-day retention, 30-day tombstone.
	s, err := c.startStack("memory", "")
	if err != nil {
		return nil, err
	}
	defer s.stop()
	return c.fill(ctx, s, c.MemoryRecords, "m")
}

func (c *Config) growth(ctx context.Context, n int64) (GrowthPoint, error) {
	fmt.Fprintf(c.Log, "growth with %d records:\n", n)
	g := GrowthPoint{Records: n}
	s, err := c.startStack(fmt.Sprintf("growth-%d", n), benchPolicy)
	if err != nil {
		return g, err
	}
	defer s.stop()
	c.pids[0], c.pids[1] = s.pids()
	m, err := c.fill(ctx, s, n, "g")
	if err != nil {
		return g, err
	}
	g.PerRecord = m.PerRecord
	t, err := Dial(s.addr, c.Conns)
	if err != nil {
		return g, err
	}
	defer t.Close()
	var health, reserve []*Result
	for round := range c.Rounds {
		spec := Spec{Name: "health Check", Concurrency: c.Concurrency, Warmup: c.Warmup, Duration: c.Duration}
		h, err := c.run(ctx, spec, t.Health())
		if err != nil {
			return g, err
		}
		spec.Name = reserveName
		r, err := c.run(ctx, spec, t.ReserveNew("r"+strconv.Itoa(round)))
		if err != nil {
			return g, err
		}
		health, reserve = append(health, h), append(reserve, r)
	}
	sum := summarize([][]*Result{health, reserve})
	g.Health, g.Reserve = sum[0], sum[1]
	return g, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }

func us(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(d)/1e3)
}

func (c *Config) printThroughput(rep *Report) {
	if len(rep.Throughput) == 0 {
		return
	}
	fmt.Fprintf(c.Out, "\nthroughput at %d concurrent calls (%v windows after %v of warmup; medians of %d rounds; ratios to health Check of the same round):\n",
		c.Concurrency, c.Duration, c.Warmup, c.Rounds)
	w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "scenario\tcalls/s\tRPCs/s\tp50\tp99\tRPCs/s ÷ health\tp50 ÷ health\tp99 ÷ health\tCPU µs/call: load\tledgerd\tredis\t")
	for _, r := range rep.Throughput {
		fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%s\t%s\t%.2f\t%.2f\t%.2f\t%s\t%s\t%s\t\n", r.Name, r.RPS, r.RPS*float64(r.RPCs), ms(r.P50), ms(r.P99),
			r.RatioRPS, r.RatioP50, r.RatioP99, us(r.CPU.Client), us(r.CPU.Ledgerd), us(r.CPU.Redis))
	}
	_ = w.Flush()
	c.printAgainstBare(rep.Throughput, "throughput: RPCs/s", func(s *Summary) float64 { return 1 / s.RatioRPS })
	if len(rep.Latency) > 0 {
		fmt.Fprintf(c.Out, "\nlatency at concurrency 1 (%v windows; medians of %d rounds):\n", c.LatencyDuration, c.Rounds)
		w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(w, "scenario\tcalls/s\tp50\tp99\tp50 ÷ health\tCPU µs/call: load\tledgerd\tredis\t")
		for _, x := range rep.Latency {
			fmt.Fprintf(w, "%s\t%.0f\t%s\t%s\t%.2f\t%s\t%s\t%s\t\n", x.Name, x.RPS, ms(x.P50), ms(x.P99), x.RatioP50, us(x.CPU.Client), us(x.CPU.Ledgerd), us(x.CPU.Redis))
		}
		_ = w.Flush()
		c.printAgainstBare(rep.Latency, "latency at concurrency 1: p50", func(s *Summary) float64 { return s.RatioP50 })
	}
}

// printAgainstBare prints each ledger scenario against the bare server (the
// floor of one Redis round trip per call), from their ratios to health
// Check: cost(s) is a scenario's cost relative to health Check (1/throughput
// ratio, or latency ratio).
func (c *Config) printAgainstBare(sums []*Summary, what string, cost func(*Summary) float64) {
	var bare *Summary
	for _, s := range sums {
		if s.Name == BareName {
			bare = s
		}
	}
	if bare == nil || cost(bare) == 0 {
		return
	}
	fmt.Fprintf(c.Out, "  against the bare server (%s, per RPC, cost ÷ the bare server's; 1.00: no more than one Redis round trip costs):", what)
	for _, s := range sums {
		if s == bare || s.Name == "health Check" || cost(s) == 0 {
			continue
		}
		fmt.Fprintf(c.Out, " %s %.2f;", s.Name, cost(s)/cost(bare))
	}
	fmt.Fprintln(c.Out)
}

func (c *Config) printMemory(m *Memory) {
	fmt.Fprintf(c.Out, "\nmemory: %d SUCCEEDED records with a %d-byte result (default policy: 7-day retention, 30-day tombstone)\n", m.Records, ResultBytes)
	fmt.Fprintf(c.Out, "  %.0f bytes per record (used_memory without client buffers: %d before, %d after); %.2f keys per record\n", m.PerRecord, m.Before, m.After, m.KeysPerRecord)
	if m.SampleKeyUsage != "" {
		fmt.Fprintf(c.Out, "  one record's keys (MEMORY USAGE): %s\n", m.SampleKeyUsage)
	}
}

func (c *Config) printGrowth(gs []GrowthPoint) {
	fmt.Fprintf(c.Out, "\ngrowth: Reserve of new keys at %d concurrent calls with N SUCCEEDED records stored:\n", c.Concurrency)
	w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "records stored\tbytes/record\thealth calls/s\tReserve calls/s\tReserve ÷ health\tReserve p50\tReserve p99\t")
	for _, g := range gs {
		fmt.Fprintf(w, "%d\t%.0f\t%.0f\t%.0f\t%.2f\t%s\t%s\t\n", g.Records, g.PerRecord, g.Health.RPS, g.Reserve.RPS, g.Reserve.RatioRPS,
			ms(g.Reserve.P50), ms(g.Reserve.P99))
	}
	_ = w.Flush()
}

// environment describes the machine and the store.
func environment(redisAddr string) string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	redis := "redis ?"
	if r, err := DialRedis(redisAddr); err == nil {
		if m, err := r.Info("server"); err == nil {
			redis = "redis-server " + m["redis_version"]
		}
		if m, err := r.Info("memory"); err == nil {
			redis += " (" + m["mem_allocator"] + ")"
		}
		r.Close()
	}
	return fmt.Sprintf("machine: %s/%s, %d CPUs (%s); %s; %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), cpu, runtime.Version(), redis)
}

// encodeComponent percent-encodes like the ledger's keys (ledger/keys.go).
func encodeComponent(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if 'a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || ch == '.' || ch == '_' || ch == '~' || ch == '-' {
			b.WriteByte(ch)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", ch)
	}
	return b.String()
}
