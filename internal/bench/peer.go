package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/redisconf"
	"github.com/opledger/ledger/ledger"
)

// The peer part sets the ledger's Reserve+Complete cycle beside the same
// cycle of github.com/faustbrian/go-idempotency, on one fresh redis-server:
// the ledger in-process (ledger.Ledger, as ledgerd runs it), the peer
// in-process (its Valkey store through valkey-go) and the ledger over gRPC
// (ledgerd), rounds alternating. Each in-process cycle runs in a process of
// its own, a cycler, which speaks one protocol on its stdout: "start" when
// its measured window starts, then "error MESSAGE" if a cycle failed, then
// "end CALLS ERRORS ELAPSED_NS". The peer's cycler is the nested module
// internal/bench/peer, built by the part, so the peer stays out of the
// service's module graph.

// CycleCommand is the benchmark binary's command that runs the ledger's
// cycler: cmd/ledgerbench calls RunCycle when its first argument is this.
const CycleCommand = "cycle-inproc"

// InprocPrefix is the key prefix of the in-process ledger's records, apart
// from ledgerd's so that ledgerd's sweeper never reads them.
const InprocPrefix = "benchinproc"

// CycleOptions configure the ledger's cycler.
type CycleOptions struct {
	RedisAddr   string
	Prefix      string // of the operation ids (OperationID)
	Concurrency int
	// Warmup and Duration are the unmeasured time and the window; with
	// Count set, exactly Count cycles run instead, all measured.
	Warmup, Duration time.Duration
	Count            int64
	// DefaultPolicy records under the default policy (7-day retention)
	// instead of the benchmark's, for a memory measurement.
	DefaultPolicy bool
	// RunSteps, when set, makes every operation a step of a run of this
	// many, each run governed by an implicit run policy (runsPolicy).
	RunSteps int64
	// Ungoverned, with RunSteps, leaves the runs without a policy: each
	// Reserve carries a run id that no run governs (the MCP gateway's
	// session, with no run policy).
	Ungoverned bool
}

// runsPolicy governs every run id, with limits no cycler reaches.
const runsPolicy = "runs:\n  - max_steps: 1000000\n    deadline: 1h\n    implicit: true\n"

// CycleMain parses the cycler's flags from args (exiting 2 on a usage
// error, as flag.ExitOnError does) and runs RunCycle, writing to out.
func CycleMain(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet(CycleCommand, flag.ExitOnError)
	var o CycleOptions
	fs.StringVar(&o.RedisAddr, "redis-addr", "", "the Redis to store the records in")
	fs.StringVar(&o.Prefix, "prefix", "i", "the operation ids' prefix")
	fs.IntVar(&o.Concurrency, "concurrency", 50, "concurrent cycles")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "unmeasured cycles before the window")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "the measured window")
	fs.Int64Var(&o.Count, "count", 0, "run exactly this many cycles instead of a window")
	fs.BoolVar(&o.DefaultPolicy, "default-policy", false, "record under the default policy (7-day retention) instead of the benchmark's")
	fs.Int64Var(&o.RunSteps, "run-steps", 0, "make every operation a step of a governed run of this many (0: no runs)")
	fs.BoolVar(&o.Ungoverned, "ungoverned", false, "with --run-steps, no run policy: the run ids govern nothing")
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "ledgerbench %s: unexpected arguments: %v\n", CycleCommand, fs.Args())
		os.Exit(2)
	}
	return RunCycle(ctx, o, out)
}

// RunCycle runs Reserve+Complete cycles of new operations on a ledger.Ledger
// over the Redis at o.RedisAddr, set up as ledgerd sets up its own, and
// writes the cycler protocol to out.
func RunCycle(ctx context.Context, o CycleOptions, out io.Writer) error {
	opts := &redis.Options{Addr: o.RedisAddr, DisableIdentity: true}
	redisconf.Single(opts)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	defer redisconf.Autopipeline(rdb).Close()
	doc := benchPolicy
	if o.DefaultPolicy {
		doc = ""
	}
	if o.RunSteps > 0 && !o.Ungoverned {
		doc += runsPolicy
	}
	var pol *ledger.Policies
	if doc != "" {
		var err error
		if pol, err = ledger.ParsePolicies([]byte(doc)); err != nil {
			return err
		}
	}
	l, err := ledger.New(rdb, ledger.Options{Prefix: InprocPrefix, Policies: pol, UnresolvedLimit: func(string) int { return 1_000_000_000 }})
	if err != nil {
		return err
	}
	if err := l.LoadScripts(ctx); err != nil {
		return err
	}
	spec := Spec{Concurrency: o.Concurrency, Warmup: o.Warmup, Duration: o.Duration, Count: o.Count, Window: func(start bool) {
		if start {
			fmt.Fprintln(out, "start")
		}
	}}
	r := Drive(ctx, spec, inprocCycle(l, o.Prefix, o.RunSteps))
	if r.FirstErr != nil {
		fmt.Fprintln(out, "error", strings.ReplaceAll(r.FirstErr.Error(), "\n", " "))
	}
	fmt.Fprintln(out, "end", r.Calls, r.Errors, int64(r.Elapsed))
	return ctx.Err()
}

// resultData is the cycle's result: {"id":"…"}, ResultBytes long.
var resultData = []byte(`{"id":"` + strings.Repeat("r", ResultBytes-len(`{"id":""}`)) + `"}`)

// inprocCycle is the Reserve of a new operation (the request of the
// Reserve scenario) and its Complete with a ResultBytes result; with
// runSteps, the operation is a step of run (seq-1)/runSteps.
func inprocCycle(l *ledger.Ledger, prefix string, runSteps int64) Call {
	result := &ledger.Result{Data: resultData}
	return func(ctx context.Context, seq int64) error {
		id := OperationID(prefix, seq)
		run := ""
		if runSteps > 0 {
			run = runOf(prefix, (seq-1)/runSteps)
		}
		res, err := l.Reserve(ctx, bareWho, ledger.ReserveRequest{
			OperationID: id, Tool: "payments.refund", Params: refundParams,
			PermitID: "approval-77", Holder: holder(seq), RunID: run,
		})
		if err != nil {
			return err
		}
		if res.Decision != ledger.DecisionExecute {
			return fmt.Errorf("Reserve(%s) decided %v", id, res.Decision)
		}
		_, err = l.Complete(ctx, bareWho, ledger.CompleteRequest{
			OperationID: id, FencingToken: res.Operation.FencingToken, Outcome: ledger.OutcomeSucceeded, Result: result,
		})
		return err
	}
}

// Peer is the peer part's report.
type Peer struct {
	// Cycle is each way's cycles (peerWays' order): CPU.Client is the
	// cycler's whole process, the load generator for the gRPC way.
	Cycle [3]*Summary
	// Ratios are medians of the rounds: the ledger in-process cycles/s ÷
	// the peer's, the ledger over gRPC cycles/s ÷ the peer's, and the
	// ledger's Redis CPU per in-process cycle ÷ the peer's.
	InprocRatio, GRPCRatio, RedisRatio float64
	// Memory is the store's bytes per SUCCEEDED record (100-byte result,
	// 7-day retention) of the ledger and of the peer; zero when not
	// measured.
	Memory [2]float64
	// Unavailable says why the peer was not measured (the ledger's ways
	// were); empty when it was.
	Unavailable string
}

// peerWays name the part's ways, in Peer.Cycle's order.
var peerWays = [3]string{"ledger in-process", "peer in-process", "ledger over gRPC"}

// peerPart measures Peer on a fresh stack.
func (c *Config) peerPart(ctx context.Context) (*Peer, error) {
	fmt.Fprintln(c.Log, "peer:")
	rep := &Peer{}
	peerBin, err := c.peerBinary(ctx)
	if err != nil {
		rep.Unavailable = err.Error()
		fmt.Fprintln(c.Log, "  the peer is not measured:", rep.Unavailable)
	}
	s, err := c.startStack("peer", benchPolicy)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	saved := c.pids
	defer func() { c.pids = saved }()
	run := RunID()
	var rows [3][]*Result
	var ratios [3][]float64
	for round := range c.Rounds {
		r := strconv.Itoa(round)
		window := []string{"--concurrency", strconv.Itoa(c.Concurrency), "--warmup", c.Warmup.String(), "--duration", c.Duration.String()}
		ours, err := c.cycler(ctx, s.redis, peerWays[0], c.Cycler, append([]string{CycleCommand, "--prefix", run + "i" + r}, window...))
		if err != nil {
			return nil, err
		}
		rows[0] = append(rows[0], ours)
		if peerBin != "" {
			theirs, err := c.cycler(ctx, s.redis, peerWays[1], peerBin, append([]string{"--prefix", run + "p" + r}, window...))
			if err != nil {
				return nil, err
			}
			rows[1] = append(rows[1], theirs)
		}
		grpc, err := c.windowOn(ctx, s, Spec{Name: peerWays[2], RPCs: 2}, func(t *Target) Call { return t.Cycle(run + "g" + r) })
		if err != nil {
			return nil, err
		}
		rows[2] = append(rows[2], grpc)
		if peerBin != "" && rows[1][round].RPS() > 0 && rows[1][round].CPU.Redis > 0 {
			theirs := rows[1][round]
			ratios[0] = append(ratios[0], ours.RPS()/theirs.RPS())
			ratios[1] = append(ratios[1], grpc.RPS()/theirs.RPS())
			ratios[2] = append(ratios[2], float64(ours.CPU.Redis)/float64(theirs.CPU.Redis))
		}
	}
	for i := range rows {
		if len(rows[i]) > 0 {
			rep.Cycle[i] = summarize([][]*Result{rows[i]})[0]
		}
	}
	rep.InprocRatio, rep.GRPCRatio, rep.RedisRatio = median(ratios[0]), median(ratios[1]), median(ratios[2])
	if c.MemoryRecords > 0 {
		if err := c.peerMemory(ctx, rep, peerBin); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// peerMemory measures Peer.Memory: c.MemoryRecords cycles of each
// in-process way on a fresh redis-server of its own (cyclesMemory).
func (c *Config) peerMemory(ctx context.Context, rep *Peer, peerBin string) error {
	bins := [2]string{c.Cycler, peerBin}
	args := [2][]string{{CycleCommand, "--default-policy"}, nil}
	for i, bin := range bins {
		if bin == "" {
			continue
		}
		dir := filepath.Join(c.Dir, "peer-memory-"+strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		r, err := startRedisOn(c.placement, c.RedisServer, dir, c.redisArgs())
		if err != nil {
			return err
		}
		perRecord, err := c.cyclesMemory(ctx, r, peerWays[i]+" memory", bin, args[i])
		r.Stop()
		if err != nil {
			return err
		}
		rep.Memory[i] = perRecord
	}
	return nil
}

// cyclesMemory runs one cycle of the cycler bin with args on r, then
// c.MemoryRecords more, and returns the store's memory per record of the
// latter, read before and after them with no cycler connected.
func (c *Config) cyclesMemory(ctx context.Context, r *Process, name, bin string, args []string) (float64, error) {
	if _, err := c.cycler(ctx, r, name+" warm-up", bin, append(slices.Clone(args), "--prefix", "w", "--count", "1", "--concurrency", "1")); err != nil {
		return 0, err
	}
	before, err := storeMemory(r.Addr)
	if err != nil {
		return 0, err
	}
	n := strconv.FormatInt(c.MemoryRecords, 10)
	if _, err := c.cycler(ctx, r, name, bin, append(slices.Clone(args), "--prefix", "m", "--count", n, "--concurrency", strconv.Itoa(max(c.Concurrency, 100)))); err != nil {
		return 0, err
	}
	after, err := storeMemory(r.Addr)
	if err != nil {
		return 0, err
	}
	return float64(after-before) / float64(c.MemoryRecords), nil
}

// peerBinary is the peer's cycler, built by the first part that needs it
// (buildPeer); later parts of the run take the same binary, or error.
func (c *Config) peerBinary(ctx context.Context) (string, error) {
	if !c.peer.built {
		c.peer.bin, c.peer.err = c.buildPeer(ctx)
		c.peer.built = true
	}
	return c.peer.bin, c.peer.err
}

// buildPeer builds the peer's cycler from c.PeerModule in the scratch
// directory and returns the binary. With c.PeerSource, the peer's module
// is that source tree instead of the one the Go module proxy serves.
func (c *Config) buildPeer(ctx context.Context) (string, error) {
	if c.PeerModule == "" {
		return "", errors.New("no peer module (--peer-module)")
	}
	dir := filepath.Join(c.Dir, "peer-build")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(c.PeerModule, f))
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			return "", err
		}
	}
	goCmd := func(args ...string) error {
		cmd := exec.CommandContext(ctx, c.goTool(), args...)
		cmd.Dir = dir
		// The copy's go.sum takes what the build downloads.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %s", args[0], goError(string(out), err))
		}
		return nil
	}
	if c.PeerSource != "" {
		src, err := filepath.Abs(c.PeerSource)
		if err != nil {
			return "", err
		}
		if err := goCmd("mod", "edit", "-replace", peerModule+"="+src); err != nil {
			return "", err
		}
	}
	bin := filepath.Join(dir, "peer")
	if err := goCmd("build", "-o", bin, "."); err != nil {
		if c.PeerSource == "" {
			err = fmt.Errorf("%w (--peer-src DIR builds it from a source tree of %s)", err, peerModule)
		}
		return "", err
	}
	return bin, nil
}

// peerModule is the peer's module path.
const peerModule = "github.com/faustbrian/go-idempotency"

func (c *Config) goTool() string {
	if c.Go != "" {
		return c.Go
	}
	return "go"
}

// goError is the go command's first error, on one line with the indented
// lines that continue it, without its progress lines ("go: downloading
// ..."); err's text when it said nothing else.
func goError(out string, err error) string {
	var said []string
	for l := range strings.SplitSeq(out, "\n") {
		indented := strings.HasPrefix(l, "\t") || strings.HasPrefix(l, " ")
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "go: downloading ") || strings.HasPrefix(l, "go: finding "):
		case len(said) == 0 || indented:
			said = append(said, l)
		default:
			return strings.Join(said, " ")
		}
	}
	if len(said) == 0 {
		return err.Error()
	}
	return strings.Join(said, " ")
}

// cycler runs a cycler (bin with args, on the redis-server rdb) and
// returns its window's Result, with the CPU per cycle of the cycler's
// process (as CPU.Client) and of rdb.
func (c *Config) cycler(ctx context.Context, rdb *Process, name, bin string, args []string) (*Result, error) {
	fmt.Fprintf(c.Log, "  %s ...\n", name)
	log, err := os.Create(filepath.Join(c.Dir, strings.ReplaceAll(name, " ", "-")+".log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, bin, append(args, "--redis-addr", rdb.Addr)...)
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	res, perr := readCycler(stdout, name, cmd.Process.Pid, rdb.cmd.Process.Pid)
	if err := cmd.Wait(); err != nil && perr == nil {
		perr = fmt.Errorf("%s: %w; its log: %s", name, err, lastLines(log.Name(), 3))
	}
	if perr != nil {
		return nil, perr
	}
	if res.Errors > 0 {
		return nil, fmt.Errorf("%s: %d of %d cycles failed; the first: %v", name, res.Errors, res.Errors+res.Calls, res.FirstErr)
	}
	return res, nil
}

// readCycler reads the cycler protocol from r, sampling the CPU of the
// cycler's and Redis's processes when the window starts and ends.
func readCycler(r io.Reader, name string, pid, redisPid int) (*Result, error) {
	m := &cpuMeter{ledgerd: pid, redis: redisPid}
	res := &Result{Spec: Spec{Name: name, RPCs: 2}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		verb, rest, _ := strings.Cut(sc.Text(), " ")
		switch verb {
		case "start":
			m.window(true)
		case "error":
			res.FirstErr = errors.New(rest)
		case "end":
			m.window(false)
			var elapsed int64
			if _, err := fmt.Sscan(rest, &res.Calls, &res.Errors, &elapsed); err != nil {
				return nil, fmt.Errorf("%s: its end line %q: %w", name, rest, err)
			}
			res.Elapsed = time.Duration(elapsed)
			cpu := m.perCall(res.Calls)
			res.CPU = CPU{Client: cpu.Ledgerd, Redis: cpu.Redis}
			return res, nil
		}
	}
	return nil, fmt.Errorf("%s ended without its end line", name)
}

func (c *Config) printPeer(p *Peer) {
	fmt.Fprintf(c.Out, "\npeer: Reserve+Complete cycles of new keys at %d concurrent calls on one fresh redis-server, the ledger against %s (%v windows; medians of %d rounds, alternating):\n",
		c.Concurrency, peerModule, c.Duration, c.Rounds)
	if p.Unavailable != "" {
		fmt.Fprintf(c.Out, "  the peer is not measured: %s\n", p.Unavailable)
	}
	w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "way\tcycles/s\tCPU µs/cycle: agent process\tledgerd\tredis\tbytes/record\t")
	for i, s := range p.Cycle {
		if s == nil {
			continue
		}
		mem := "-"
		if i < 2 && p.Memory[i] > 0 {
			mem = fmt.Sprintf("%.0f", p.Memory[i])
		}
		fmt.Fprintf(w, "%s\t%.0f\t%s\t%s\t%s\t%s\t\n", peerWays[i], s.RPS, us(s.CPU.Client), us(s.CPU.Ledgerd), us(s.CPU.Redis), mem)
	}
	_ = w.Flush()
	if p.Unavailable == "" {
		fmt.Fprintf(c.Out, "  per round, ÷ the peer in-process: the ledger in-process cycles/s %.2f, over gRPC %.2f; Redis CPU per cycle %.2f\n",
			p.InprocRatio, p.GRPCRatio, p.RedisRatio)
	}
}
