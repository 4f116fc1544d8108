package mcptest

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestMain(m *testing.M) {
	ServeStdioIfAsked()
	os.Exit(m.Run())
}

// connect opens a session to u over Streamable HTTP.
func connect(t *testing.T, u *Upstream) *mcp.ClientSession {
	t.Helper()
	hs := httptest.NewServer(u.Handler())
	t.Cleanup(hs.Close)
	c := mcp.NewClient(&mcp.Implementation{Name: "mcptest-test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: hs.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// TestFaults: each fault does what Fault says to the call it is queued
// for, and Count, Calls and Effects say what arrived and what was applied.
func TestFaults(t *testing.T) {
	for _, tc := range []struct {
		fault   string
		timeout time.Duration
		isError bool
		failed  bool // the call got no answer
		effects int
		calls   int // of create_ticket:cancelled
	}{
		{fault: "none", effects: 1},
		{fault: "error", isError: true},
		{fault: "hang", timeout: 200 * time.Millisecond, failed: true},
		{fault: "drop", timeout: 200 * time.Millisecond, failed: true, effects: 1},
		{fault: "slow:100ms", effects: 1},
		{fault: "slow:10s", timeout: 200 * time.Millisecond, failed: true, calls: 1},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			u := New(t.TempDir())
			cs := connect(t, u)
			if tc.fault != "none" {
				u.Fault("create_ticket", tc.fault)
			}
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: map[string]any{"title": "printer"},
				Meta: mcp.Meta{"idempotencyKey": "k1"}})
			if (err != nil) != tc.failed || (err == nil && res.IsError != tc.isError) {
				t.Fatalf("call = %+v, %v; want failed %v, isError %v", res, err, tc.failed, tc.isError)
			}
			// A cancelled call notices after its answer was given up on.
			deadline := time.Now().Add(5 * time.Second)
			for u.Calls("create_ticket:cancelled") < tc.calls && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := u.Count("create_ticket"); n != tc.effects {
				t.Errorf("%d effects, want %d", n, tc.effects)
			}
			if n := u.Calls("create_ticket"); n != 1 {
				t.Errorf("%d calls arrived, want 1", n)
			}
			if n := u.Calls("create_ticket:cancelled"); n != tc.calls {
				t.Errorf("%d cancelled, want %d", n, tc.calls)
			}
			// The next call has no fault left: it applies.
			if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "create_ticket", Arguments: map[string]any{"title": "again"}}); err != nil || res.IsError {
				t.Fatalf("the next call = %+v, %v", res, err)
			}
			if n := u.Count("create_ticket"); n != tc.effects+1 {
				t.Errorf("%d effects after the next call, want %d", n, tc.effects+1)
			}
		})
	}
}

// TestFindTicket: find_ticket answers what create_ticket answered under
// the key, and {"found": false} for another key, applying nothing.
func TestFindTicket(t *testing.T) {
	u := New(t.TempDir())
	cs := connect(t, u)
	ctx := context.Background()
	created, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: map[string]any{"title": "a"}, Meta: mcp.Meta{"idempotencyKey": "k1"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, want string }{
		{"k1", jsonOf(t, created.StructuredContent)},
		{"k2", `{"found":false}`},
		{"", `{"found":false}`},
	} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "find_ticket", Arguments: map[string]any{"idempotency_key": tc.key}})
		if err != nil {
			t.Fatal(err)
		}
		if got := jsonOf(t, res.StructuredContent); got != tc.want {
			t.Errorf("find_ticket(%q) = %s, want %s", tc.key, got, tc.want)
		}
	}
	if n := len(u.Effects()); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

// TestStdio: over stdio the "kill" fault applies the effect and ends the
// process, Kill ends it from outside, and Down keeps it from starting again
// until Up.
func TestStdio(t *testing.T) {
	u := New(t.TempDir())
	start := func() (*mcp.ClientSession, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), StdioEnv+"="+u.Dir)
		c := mcp.NewClient(&mcp.Implementation{Name: "mcptest-test", Version: "1"}, nil)
		return c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	}
	ctx := context.Background()
	cs, err := start()
	if err != nil {
		t.Fatal(err)
	}
	u.Fault("create_ticket", "kill")
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: map[string]any{"title": "a"}}); err == nil {
		t.Fatalf("the killed call answered %+v", res)
	}
	if n := u.Count("create_ticket"); n != 1 {
		t.Errorf("%d effects of the killed call, want 1", n)
	}
	if cs, err = start(); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "set_status", Arguments: map[string]any{"id": "T-1", "status": "done"}}); err != nil {
		t.Fatal(err)
	}
	if err := u.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cs.Wait()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "set_status", Arguments: map[string]any{"id": "T-1", "status": "open"}}); err == nil {
		t.Error("a call after Kill was answered")
	}
	if n := u.Count("set_status"); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
	u.Down()
	if cs, err := start(); err == nil {
		_ = cs.Close()
		t.Fatal("the fake started while down")
	}
	u.Up()
	if cs, err = start(); err != nil {
		t.Fatalf("after Up: %v", err)
	}
	_ = cs.Close()
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
