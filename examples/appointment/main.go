// Command appointment is the seed exercise of the operation ledger
// (contract.md S9): an agent books a clinic appointment through a flaky, non-idempotent
// clinic API, and the ledger makes sure exactly one appointment exists.
//
//	go run ./examples/appointment       # prints the story, exits 1 unless it holds
//	go run ./examples/appointment -v    # also the agent's tool_start/tool_end logs on stderr
//
// It needs nothing else: the ledger runs in-process on the embedded engine
// (miniredis), served over gRPC on a loopback port, and the agent workers
// talk to it through the Go SDK (client) and the agent runner (client/agent)
// exactly as they would talk to a real ledgerd.
//
// The fake clinic honours no idempotency key: every create request makes an
// appointment. It keeps the operation id as the appointment's reference, so
// the tool's reconciler can ask it whether the operation's appointment
// exists. It injects three faults: a refusal before the write (retryable), a
// write whose response is lost (ambiguous), and a worker that crashes after
// the response, before it saves its state. The same operation is then sent
// five times, two of them concurrently.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

func main() {
	verbose := flag.Bool("v", false, "print the agent's structured logs (tool_start/tool_end) on stderr")
	flag.Parse()
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	if err := runWith(os.Stdout, logger); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
}

// run plays the scenario, printing it to w; it fails unless exactly one
// appointment exists for the operation, every retry returned its id, the
// rewritten payload was refused and a new key booked a second appointment.
func run(w io.Writer) error { return runWith(w, slog.New(slog.DiscardHandler)) }

// The ledger's policy for the tool: irreversible (the clinic has no
// idempotency key), and only what makes it another appointment is
// fingerprinted.
const policy = `
tools:
  - match: "create_appointment"
    effect: irreversible
    lease: 10s
    consequential_fields: ["/patient_id", "/slot/start", "/slot/provider_id"]
`

const tool = "create_appointment"

func runWith(w io.Writer, logger *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := &syncWriter{w: w}

	addr, stop, err := startLedger()
	if err != nil {
		return err
	}
	defer stop()
	out.printf("S9: an agent books an appointment through the operation ledger (embedded, in memory, at %s)\n", addr)

	sc := &scene{
		ctx: ctx, out: out, addr: addr, logger: logger,
		clinic: &fakeClinic{out: out, faults: []fault{refuseBeforeWrite, timeoutAfterWrite}},
		store:  &checkpoints{saved: map[string][]agent.Message{}},
		args: map[string]any{
			"patient_id": "pat-314",
			"slot":       map[string]any{"start": "2030-05-06T09:30:00Z", "provider_id": "dr-ng"},
			"note":       "follow-up",
		},
		ids: map[int]string{},
	}
	if err := sc.sendFiveTimes(); err != nil {
		return err
	}
	// The appointment of the operation, as the clinic knows it.
	appt, found := sc.clinic.find(opID)
	sc.check(found && sc.clinic.count() == 1, "the clinic has %d appointments, want exactly 1", sc.clinic.count())
	for send := 1; send <= 5; send++ {
		got, ok := sc.ids[send]
		sc.check(got == appt.ID || send == 1 && !ok, "send %d returned %q, want %q", send, got, appt.ID)
	}
	if err := sc.rewrite(); err != nil {
		return err
	}
	second, err := sc.newIntent(appt.ID)
	if err != nil {
		return err
	}
	out.printf("clinic: %d appointment(s) for %s (%s), %d in total after the new key\n", sc.clinic.countFor(opID), opID, appt.ID, sc.clinic.count())
	if len(sc.problems) > 0 {
		for _, p := range sc.problems {
			out.printf("FAIL: %s\n", p)
		}
		return fmt.Errorf("%d check(s) failed", len(sc.problems))
	}
	out.printf("PASS: one appointment, every retry returned %s, the rewrite was refused, the new key booked %s\n", appt.ID, second)
	return nil
}

// The run and the operation every send of the story is about.
const (
	runID = "visit-42"
	opID  = runID + ":call-1"
)

// request is what the patient asked for.
var request = []agent.Message{{Role: agent.RoleUser, Text: "Book me with Dr. Ng on May 6 at 9:30."}}

// scene is the story's world: the ledger's address, the clinic, the saved
// states, and what the sends came to.
type scene struct {
	ctx    context.Context
	out    *syncWriter
	addr   string
	logger *slog.Logger
	clinic *fakeClinic
	store  *checkpoints
	args   map[string]any // the tool call's arguments

	// The third fault: the first worker that receives the appointment id
	// crashes before it saves its state.
	crashOnce sync.Once
	crashed   bool

	ids      map[int]string // send -> appointment id it returned
	problems []string
}

// check records a problem, described by format, unless ok.
func (sc *scene) check(ok bool, format string, a ...any) {
	if !ok {
		sc.problems = append(sc.problems, fmt.Sprintf(format, a...))
	}
}

// newWorker is one agent process: its own ledger client and runner, and
// the function that closes its client.
func (sc *scene) newWorker(name string) (*agent.Runner, func(), error) {
	c, err := client.Dial(sc.addr, client.WithBackoff(client.Backoff{Base: 10 * time.Millisecond, Max: 100 * time.Millisecond}))
	if err != nil {
		return nil, nil, err
	}
	r, err := agent.New(agent.Config{
		Client:     c,
		Model:      scriptedModel(sc.out, sc.args),
		Tools:      []agent.Tool{appointmentTool(sc.clinic, sc.out)},
		Logger:     sc.logger.With("worker", name),
		Checkpoint: sc.checkpoint,
		MaxSteps:   5, Deadline: 10 * time.Second, ModelTimeout: 2 * time.Second,
	})
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return r, func() { _ = c.Close() }, nil
}

// checkpoint saves a run's transcript, except the first time it holds the
// appointment's id: then the worker crashes before it saves it.
func (sc *scene) checkpoint(_ context.Context, runID string, tr []agent.Message) error {
	crash := false
	if last := tr[len(tr)-1]; last.Result != nil && last.Result.ResourceID != "" {
		sc.crashOnce.Do(func() { crash, sc.crashed = true, true })
	}
	if crash {
		return errCrash // the response arrived; the state was never saved
	}
	sc.store.save(runID, tr)
	return nil
}

// work runs in on a new worker.
func (sc *scene) work(name string, in agent.Input) (agent.Outcome, error) {
	r, done, err := sc.newWorker(name)
	if err != nil {
		return agent.Outcome{}, err
	}
	defer done()
	return r.Run(sc.ctx, in), nil
}

// report prints what a worker's send of the operation came to. Only the
// messages the worker appended count: each send must reach the ledger.
func (sc *scene) report(send int, in agent.Input, o agent.Outcome) {
	res := newResult(o, len(in.Transcript))
	switch {
	case res != nil:
		sc.ids[send] = res.ResourceID
	case o.Status == agent.StatusDone:
		sc.check(false, "send %d: done without sending the operation", send)
	}
	switch {
	case o.Status == agent.StatusDone:
		how := "executed"
		if res != nil && res.Replayed {
			how = "replayed by the ledger"
		}
		sc.out.printf("  worker %d: %s, %q (%s)\n", send, o.Status, o.Answer, how)
	case errors.Is(o.Err, errCrash):
		sc.out.printf("  worker %d got %s, then crashed before saving its state (status %s)\n", send, sc.ids[send], o.Status)
	case errors.Is(o.Err, client.ErrNeedsReconciliation):
		sc.out.printf("  worker %d stops (status %s): the outcome is unknown; the call stays pending\n", send, o.Status)
	default:
		sc.out.printf("  worker %d: %s: %v\n", send, o.Status, o.Err)
		sc.check(false, "send %d: status %s (%v)", send, o.Status, o.Err)
	}
}

// sendFiveTimes sends the operation five times, two of them at once.
func (sc *scene) sendFiveTimes() error {
	// Send 1: refused, retried by the SDK, written but the response is lost,
	// reconciled, and the worker crashes before saving the answer.
	sc.out.printf("send 1 (worker 1 runs the request):\n")
	in := agent.Input{RunID: runID, PermitID: "approval-9", Transcript: request}
	o, err := sc.work("1", in)
	if err != nil {
		return err
	}
	sc.report(1, in, o)

	// The at-least-once queue delivers the job again, with the state saved
	// before the crash: the call is pending. Every worker sends it again.
	in.Transcript = sc.store.load(runID)
	sc.out.printf("the queue re-delivers the job 4 times, with the state saved before the crash (the call pending):\n")
	if o, err = sc.work("2", in); err != nil {
		return err
	}
	sc.report(2, in, o)

	outs := make([]agent.Outcome, 2) // sends 3 and 4, at the same time
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Go(func() { outs[i], errs[i] = sc.work(fmt.Sprint(i+3), in) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	sc.out.printf("  (workers 3 and 4 ran at the same time)\n")
	sc.report(3, in, outs[0])
	sc.report(4, in, outs[1])

	if o, err = sc.work("5", in); err != nil {
		return err
	}
	sc.report(5, in, o)
	sc.check(sc.crashed, "no worker crashed before saving its state")
	return nil
}

// rewrite sends the same key with a rewritten payload (another slot),
// which the ledger refuses.
func (sc *scene) rewrite() error {
	rewritten := slices.Clone(request)
	moved := map[string]any{"patient_id": "pat-314", "slot": map[string]any{"start": "2030-05-06T17:00:00Z", "provider_id": "dr-ng"}, "note": "follow-up"}
	rewritten = append(rewritten, agent.Message{Role: agent.RoleAssistant, Calls: []agent.ToolCall{{ID: "call-1", Name: tool, Args: moved}}})
	o, err := sc.work("6", agent.Input{RunID: runID, PermitID: "approval-9", Transcript: rewritten})
	if err != nil {
		return err
	}
	reused := errors.Is(o.Err, client.ErrKeyReused)
	sc.check(o.Status == agent.StatusError && reused && sc.clinic.count() == 1, "rewritten payload: status %s (%v), want error: key reused", o.Status, o.Err)
	sc.out.printf("same key %s, slot moved to 17:00: %s\n", opID, refusal(o.Err))
	return nil
}

// newIntent sends a new intent under a new key, which books a second
// appointment besides first; it returns the second's id.
func (sc *scene) newIntent(first string) (string, error) {
	sc.out.printf("a new intent under a new key, visit-43:call-1:\n")
	o, err := sc.work("7", agent.Input{RunID: "visit-43", PermitID: "approval-10", Transcript: request})
	if err != nil {
		return "", err
	}
	var second string
	if r := newResult(o, len(request)); r != nil {
		second = r.ResourceID
	}
	sc.check(o.Status == agent.StatusDone && second != "" && second != first && sc.clinic.count() == 2,
		"new key: status %s (%v), id %q, %d appointments; want a second appointment", o.Status, o.Err, second, sc.clinic.count())
	sc.out.printf("  worker 7: %s, %q\n", o.Status, o.Answer)
	return second, nil
}

var errCrash = errors.New("simulated crash before saving the state")

// newResult is the create_appointment result among the messages a run
// appended after its input's first n.
func newResult(o agent.Outcome, n int) *agent.ToolResult {
	for _, m := range slices.Backward(o.Transcript[n:]) {
		if m.Result != nil && m.Result.Tool == tool {
			return m.Result
		}
	}
	return nil
}

func refusal(err error) string {
	var le *client.Error
	if errors.As(err, &le) {
		return fmt.Sprintf("refused (%s, differs: %s)", le.Reason, le.Metadata["differs"])
	}
	return fmt.Sprintf("not refused (%v)", err)
}

// scriptedModel is the fake model: it asks for the appointment, then reports
// the tool's result as its final answer.
func scriptedModel(out *syncWriter, args map[string]any) agent.ModelFunc {
	return func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
		if r := transcript[len(transcript)-1].Result; r != nil {
			if r.Error != "" {
				return agent.Turn{Text: "I could not book it: " + r.Error}, nil
			}
			return agent.Turn{Text: "Booked " + r.ResourceID}, nil
		}
		out.printf("  model: asks for %s (call id call-1)\n", tool)
		return agent.Turn{Calls: []agent.ToolCall{{ID: "call-1", Name: tool, Args: args}}}, nil
	}
}

// appointmentTool is the mutating tool: one clinic request per attempt, and
// a reconciler that asks the clinic by operation id.
func appointmentTool(clinic *fakeClinic, out *syncWriter) agent.Tool {
	return agent.Tool{
		Name:     tool,
		Mutating: true,
		Policy:   client.ToolPolicy{Timeout: 2 * time.Second, MaxRetries: 1, Effect: client.EffectIrreversible},
		Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			a, err := clinic.create(ctx, c.Attempt, c.Args)
			if err != nil {
				return client.Result{}, err // classified by client.ClassOf
			}
			return a.result(), nil
		},
		Reconciler: func(ctx context.Context, op *client.Operation) (client.Finding, error) {
			a, ok := clinic.find(op.ID)
			if !ok {
				out.printf("  reconciler: the clinic has no appointment for %s: not applied\n", op.ID)
				return client.Finding{Kind: client.NotApplied, Note: "no appointment with this reference"}, nil
			}
			out.printf("  reconciler: the clinic has %s for %s: applied, the ledger records it\n", a.ID, op.ID)
			return client.Finding{Kind: client.Applied, Result: a.result(), Note: "found by reference"}, nil
		},
	}
}

// fault is what the fake clinic does to one create request.
type fault int

const (
	noFault           fault = iota
	refuseBeforeWrite       // connection refused: nothing written (retryable)
	timeoutAfterWrite       // written, the response never arrives (ambiguous)
)

type appointment struct {
	ID, Ref, Patient, Start, Provider string
}

func (a appointment) result() client.Result {
	return client.Result{ResourceID: a.ID, Data: map[string]any{"start": a.Start, "provider_id": a.Provider}}
}

// fakeClinic is the clinic's API, in memory. It honours no idempotency key.
type fakeClinic struct {
	out    *syncWriter
	mu     sync.Mutex
	faults []fault
	appts  []appointment
}

func (c *fakeClinic) create(ctx context.Context, a client.Attempt, args map[string]any) (appointment, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := noFault
	if len(c.faults) > 0 {
		f, c.faults = c.faults[0], c.faults[1:]
	}
	if f == refuseBeforeWrite {
		c.out.printf("  attempt %d: the clinic refused the connection before writing: retryable, the SDK retries the same operation\n", a.Number)
		return appointment{}, fmt.Errorf("clinic: dial: %w", syscall.ECONNREFUSED)
	}
	slot, _ := args["slot"].(map[string]any)
	appt := appointment{ID: fmt.Sprintf("apt-%03d", len(c.appts)+1), Ref: a.OperationID, Patient: fmt.Sprint(args["patient_id"]),
		Start: fmt.Sprint(slot["start"]), Provider: fmt.Sprint(slot["provider_id"])}
	c.appts = append(c.appts, appt)
	if f == timeoutAfterWrite {
		c.out.printf("  attempt %d: the clinic wrote %s but the response timed out: ambiguous, the ledger marks it UNKNOWN\n", a.Number, appt.ID)
		return appointment{}, fmt.Errorf("clinic: no response: %w", context.DeadlineExceeded)
	}
	c.out.printf("  attempt %d: the clinic wrote %s and answered\n", a.Number, appt.ID)
	return appt, nil
}

// find looks an appointment up by its reference (the operation id).
func (c *fakeClinic) find(ref string) (appointment, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.appts {
		if a.Ref == ref {
			return a, true
		}
	}
	return appointment{}, false
}

func (c *fakeClinic) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.appts)
}

func (c *fakeClinic) countFor(ref string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, a := range c.appts {
		if a.Ref == ref {
			n++
		}
	}
	return n
}

// checkpoints is the agents' durable state: the last saved transcript per run.
type checkpoints struct {
	mu    sync.Mutex
	saved map[string][]agent.Message
}

func (s *checkpoints) save(runID string, tr []agent.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.saved[runID] = tr
}

func (s *checkpoints) load(runID string) []agent.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saved[runID]
}

// syncWriter serializes the output of concurrent workers.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) printf(format string, a ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.w, format, a...)
}

// startLedger runs the ledger service in-process, as ledgerd does without
// Redis: the embedded engine with TTLs on the real clock, the Lua scripts,
// the sweeper, and the gRPC service on a loopback port.
func startLedger() (addr string, stop func(), err error) {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.Start(); err != nil {
		return "", nil, fmt.Errorf("embedded engine: %w", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true, ContextTimeoutEnabled: true})
	quiet := slog.New(slog.DiscardHandler)
	closeStore := func() { _ = rdb.Close(); m.Close() }
	pol, err := ledger.ParsePolicies([]byte(policy))
	if err != nil {
		closeStore()
		return "", nil, err
	}
	l, err := ledger.New(rdb, ledger.Options{Policies: pol, Logger: quiet})
	if err != nil {
		closeStore()
		return "", nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		closeStore()
		return "", nil, err
	}
	svc := server.New(server.Config{Ledger: l, Logger: quiet})
	served := make(chan struct{})
	go func() { _ = svc.Serve(lis); close(served) }()
	ctx, cancel := context.WithCancel(context.Background())
	swept := make(chan struct{})
	go func() { l.RunSweeper(ctx, time.Second); close(swept) }()
	return lis.Addr().String(), func() {
		cancel()
		<-swept
		sctx, done := context.WithTimeout(context.Background(), 5*time.Second)
		svc.Shutdown(sctx)
		done()
		<-served
		closeStore()
	}, nil
}
