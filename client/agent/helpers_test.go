package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// ledgerEnv is a ledger service and a client of it.
type ledgerEnv struct {
	stack  *servicetest.Stack
	client *client.Client
}

// startLedger runs a ledger on rdb and dials it with fast backoff.
func startLedger(t *testing.T, rdb redis.UniversalClient, opts ...client.Option) *ledgerEnv {
	t.Helper()
	stack := servicetest.Start(t, rdb, servicetest.Options{})
	return &ledgerEnv{stack: stack, client: dial(t, stack.Addr, opts...)}
}

// dial returns a new client of the ledger at addr (a new "process").
func dial(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	opts = append([]client.Option{client.WithBackoff(client.Backoff{Base: time.Millisecond, Max: 10 * time.Millisecond})}, opts...)
	c, err := client.Dial(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newRunID returns a run id unique across the tests sharing a redis-server.
func newRunID(t *testing.T) string {
	return strings.NewReplacer("/", "-", ":", "-").Replace(t.Name()) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// destination is a fake system that applies effects and counts them.
type destination struct {
	mu      sync.Mutex
	byOp    map[string][]string // operation id -> resource ids created for it
	created int
}

func newDestination() *destination { return &destination{byOp: map[string][]string{}} }

// apply creates a resource for the operation (it honours no idempotency key).
func (d *destination) apply(opID string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.created++
	id := fmt.Sprintf("res-%d", d.created)
	d.byOp[opID] = append(d.byOp[opID], id)
	return id
}

// total is how many effects were applied.
func (d *destination) total() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.created
}

// find returns the resource created for an operation, if any.
func (d *destination) find(opID string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := d.byOp[opID]
	if len(ids) == 0 {
		return "", false
	}
	return ids[0], true
}

// reconciler asks the destination by operation id.
func (d *destination) reconciler(ctx context.Context, op *client.Operation) (client.Finding, error) {
	if id, ok := d.find(op.ID); ok {
		return client.Finding{Kind: client.Applied, Result: client.Result{ResourceID: id}, Note: "found at the destination"}, nil
	}
	return client.Finding{Kind: client.NotApplied, Note: "not at the destination"}, nil
}

// bookTool is a mutating tool applying one effect per run of its function.
func bookTool(d *destination) agent.Tool {
	return agent.Tool{
		Name: "book", Mutating: true,
		Policy:     client.ToolPolicy{Timeout: 5 * time.Second, MaxRetries: 1},
		Reconciler: d.reconciler,
		Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			return client.Result{ResourceID: d.apply(c.Attempt.OperationID)}, nil
		},
	}
}

// turns counts the model turns (assistant messages) of a transcript.
func turns(transcript []agent.Message) int {
	n := 0
	for _, m := range transcript {
		if m.Role == agent.RoleAssistant {
			n++
		}
	}
	return n
}

// results returns the tool results of a transcript.
func results(transcript []agent.Message) []agent.ToolResult {
	var out []agent.ToolResult
	for _, m := range transcript {
		if m.Role == agent.RoleTool && m.Result != nil {
			out = append(out, *m.Result)
		}
	}
	return out
}

// lastResult returns the last message's result, if it is a tool message.
func lastResult(transcript []agent.Message) *agent.ToolResult {
	if len(transcript) == 0 {
		return nil
	}
	return transcript[len(transcript)-1].Result
}

// user is the user's request.
func user(text string) []agent.Message {
	return []agent.Message{{Role: agent.RoleUser, Text: text}}
}

// callOnceThenAnswer is a model that asks for call c first and answers
// "done" once it has the call's result.
func callOnceThenAnswer(c agent.ToolCall) agent.ModelFunc {
	return func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
		if r := lastResult(transcript); r != nil {
			return agent.Turn{Text: "done: " + r.ResourceID}, nil
		}
		return agent.Turn{Calls: []agent.ToolCall{c}}, nil
	}
}

// mustNew builds a runner or fails the test.
func mustNew(t *testing.T, cfg agent.Config) *agent.Runner {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
