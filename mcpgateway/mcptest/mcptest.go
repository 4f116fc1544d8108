// Package mcptest is a fake MCP tool server for the gateway's tests. It
// applies every call it gets (it honours no idempotency key) and writes
// each effect to a file, so a test counts effects across its restarts,
// and it takes faults from files, so a test injects them into a server
// running as another process.
//
// Its tools: create_ticket (no annotations: irreversible; an output
// schema for {id, title}, as a typed go-sdk tool lists), find_ticket
// (read-only: the lookup by idempotency key), search_tickets (read-only)
// and set_status (idempotent).
package mcptest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// StdioEnv names the environment variable that makes a test binary serve
// the fake over stdio (see ServeStdioIfAsked), on the state directory it
// names.
const StdioEnv = "MCPTEST_STDIO_DIR"

// Effect is one applied effect.
type Effect struct {
	Tool   string          `json:"tool"`
	Key    string          `json:"key"`
	Ticket string          `json:"ticket,omitempty"`
	Args   json.RawMessage `json:"args"`
	Result json.RawMessage `json:"result,omitempty"`
}

// Upstream is the fake's state directory.
type Upstream struct {
	Dir string
	mu  sync.Mutex
}

// New makes a state directory under dir.
func New(dir string) *Upstream {
	for _, d := range []string{dir, filepath.Join(dir, "faults")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			panic(err)
		}
	}
	return &Upstream{Dir: dir}
}

// Fault queues faults for the next calls of tool, one per call, in
// order: "drop" applies the effect and never answers; "kill" applies it
// and exits the process; "hang" never answers and applies nothing;
// "error" answers isError and applies nothing ("error:structured" with
// structured content its output schema refuses, "error:D" after D);
// "slow:D" waits D (sending progress when asked), then applies and
// answers, unless the call is cancelled first (counted as a call of
// "create_ticket:cancelled");
// "big" applies it and answers with 100 KiB of text beside the ticket,
// "huge" with 17 MiB (its lookup answers without them);
// "deep" applies it and answers with a _meta nested deeper than the
// ledger keeps; "newline" applies it and answers an id ending in a
// newline, which a resource id may not hold;
// "shape" applies it and answers structured content its output schema
// refuses ({"ticket": ...}); "print" applies it and, served over stdio,
// writes three lines that are no JSON-RPC messages to stdout before it
// answers.
func (u *Upstream) Fault(tool string, faults ...string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(u.Dir, "faults", tool), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	for _, x := range faults {
		fmt.Fprintln(f, x)
	}
}

// nextFault pops the next fault queued for tool ("" for none).
func (u *Upstream) nextFault(tool string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	path := filepath.Join(u.Dir, "faults", tool)
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	first, rest, _ := strings.Cut(string(b), "\n")
	if err := os.WriteFile(path, []byte(rest), 0o644); err != nil {
		panic(err)
	}
	return first
}

// Effects returns the effects applied so far, of every tool.
func (u *Upstream) Effects() []Effect {
	return u.lines("effects")
}

// Count returns how many effects tool applied.
func (u *Upstream) Count(tool string) int {
	n := 0
	for _, e := range u.Effects() {
		if e.Tool == tool {
			n++
		}
	}
	return n
}

// Calls returns how many calls of tool arrived.
func (u *Upstream) Calls(tool string) int {
	n := 0
	for _, e := range u.lines("calls") {
		if e.Tool == tool {
			n++
		}
	}
	return n
}

func (u *Upstream) lines(name string) []Effect {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.read(name)
}

func (u *Upstream) read(name string) []Effect {
	f, err := os.Open(filepath.Join(u.Dir, name))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		panic(err)
	}
	defer f.Close()
	var out []Effect
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e Effect
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			panic(err)
		}
		out = append(out, e)
	}
	return out
}

func (u *Upstream) append(name string, e Effect) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.write(name, e)
}

func (u *Upstream) write(name string, e Effect) {
	b, _ := json.Marshal(e)
	f, err := os.OpenFile(filepath.Join(u.Dir, name), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	if _, err := f.Write(append(b, '\n')); err != nil {
		panic(err)
	}
	_ = f.Sync()
}

// Server returns the fake's MCP server.
func (u *Upstream) Server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "mcptest-tickets", Version: "1"}, nil)
	object := func(props map[string]any) map[string]any {
		return map[string]any{"type": "object", "properties": props}
	}
	str, num := map[string]any{"type": "string"}, map[string]any{"type": "number"}
	// Its output schema is what a typed go-sdk tool declares for {id, title}.
	ticket := object(map[string]any{"id": str, "title": str})
	ticket["required"], ticket["additionalProperties"] = []string{"id", "title"}, false
	s.AddTool(&mcp.Tool{Name: "create_ticket", Description: "Open a ticket.", InputSchema: object(map[string]any{"title": str, "priority": num}),
		OutputSchema: ticket}, u.create)
	s.AddTool(&mcp.Tool{Name: "find_ticket", Description: "Find the ticket a create_ticket call with this idempotency key opened.",
		InputSchema: object(map[string]any{"idempotency_key": str}), Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, u.find)
	s.AddTool(&mcp.Tool{Name: "search_tickets", Description: "Search tickets.",
		InputSchema: object(map[string]any{"query": str}), Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, u.search)
	s.AddTool(&mcp.Tool{Name: "set_status", Description: "Set a ticket's status.",
		InputSchema: object(map[string]any{"id": str, "status": str}), Annotations: &mcp.ToolAnnotations{IdempotentHint: true}}, u.setStatus)
	return s
}

// create applies create_ticket, with the next fault queued for it.
func (u *Upstream) create(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, _ := req.Params.Meta["idempotencyKey"].(string)
	u.append("calls", Effect{Tool: "create_ticket", Key: key, Args: req.Params.Arguments})
	fault, arg, _ := strings.Cut(u.nextFault("create_ticket"), ":")
	switch fault {
	case "hang":
		<-ctx.Done()
		return nil, ctx.Err()
	case "error":
		if d, err := time.ParseDuration(arg); err == nil {
			if err := u.wait(ctx, req, d); err != nil {
				return nil, err
			}
		}
		res := &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "priority must be 1 to 5"}}}
		if arg == "structured" {
			res.StructuredContent = map[string]any{"error": "priority"}
		}
		return res, nil
	case "slow":
		d, _ := time.ParseDuration(arg)
		if err := u.wait(ctx, req, d); err != nil {
			return nil, err
		}
	}
	var args map[string]any
	_ = json.Unmarshal(req.Params.Arguments, &args)
	u.mu.Lock()
	ticket := fmt.Sprintf("T-%d", len(u.read("effects"))+1)
	res := &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: "Opened ticket " + ticket + "."}},
		StructuredContent: map[string]any{"id": ticket, "title": args["title"]},
	}
	switch fault {
	case "big":
		res.Content = append(res.Content, &mcp.TextContent{Text: strings.Repeat("x", 100<<10)})
	case "shape":
		res.StructuredContent = map[string]any{"ticket": ticket}
	case "newline":
		res.StructuredContent = map[string]any{"id": ticket + "\n", "title": args["title"]}
	case "deep":
		deep := map[string]any{}
		for i, in := 1, deep; i < 64; i++ {
			in["a"] = map[string]any{}
			in = in["a"].(map[string]any)
		}
		res.Meta = mcp.Meta{"trace": deep}
	}
	b, _ := json.Marshal(res)
	u.write("effects", Effect{Tool: "create_ticket", Key: key, Ticket: ticket, Args: req.Params.Arguments, Result: b})
	u.mu.Unlock()
	switch fault {
	case "drop":
		<-ctx.Done()
		return nil, ctx.Err()
	case "kill":
		os.Exit(3)
	case "huge": // beside the effect recorded, which find_ticket answers
		res.Content = append(res.Content, &mcp.TextContent{Text: strings.Repeat("x", 17<<20)})
	case "print":
		fmt.Println("Opened " + ticket)
		fmt.Println(`{"level":30,"msg":"opened a ticket"}`)
		fmt.Println("{'ticket': '" + ticket + "'}")
	}
	return res, nil
}

// wait waits d, sending progress every tenth of it when the call asked.
func (u *Upstream) wait(ctx context.Context, req *mcp.CallToolRequest, d time.Duration) error {
	tok := req.Params.GetProgressToken()
	for i := 1; i <= 10; i++ {
		select {
		case <-ctx.Done():
			u.append("calls", Effect{Tool: req.Params.Name + ":cancelled"})
			return ctx.Err()
		case <-time.After(d / 10):
		}
		if tok != nil {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: 10})
		}
	}
	return nil
}

// find answers the result create_ticket gave under the key, or
// {"found": false}.
func (u *Upstream) find(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args struct {
		Key string `json:"idempotency_key"`
	}
	_ = json.Unmarshal(req.Params.Arguments, &args)
	u.append("calls", Effect{Tool: "find_ticket", Key: args.Key, Args: req.Params.Arguments})
	for _, e := range u.Effects() {
		if e.Tool == "create_ticket" && e.Key == args.Key && args.Key != "" {
			var res mcp.CallToolResult
			if err := json.Unmarshal(e.Result, &res); err != nil {
				return nil, err
			}
			return &res, nil
		}
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "no such ticket"}}, StructuredContent: map[string]any{"found": false}}, nil
}

func (u *Upstream) search(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	u.append("calls", Effect{Tool: "search_tickets", Args: req.Params.Arguments})
	n := len(u.Effects())
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("%d tickets", n)}}}, nil
}

func (u *Upstream) setStatus(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, _ := req.Params.Meta["idempotencyKey"].(string)
	u.append("calls", Effect{Tool: "set_status", Key: key, Args: req.Params.Arguments})
	u.append("effects", Effect{Tool: "set_status", Key: key, Args: req.Params.Arguments})
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
}

// Down keeps the fake from starting again over stdio (its process exits at
// once), until Up.
func (u *Upstream) Down() {
	if err := os.WriteFile(filepath.Join(u.Dir, "down"), nil, 0o644); err != nil {
		panic(err)
	}
}

// Up lets the fake start again.
func (u *Upstream) Up() { _ = os.Remove(filepath.Join(u.Dir, "down")) }

// Kill kills the process serving the fake over stdio.
func (u *Upstream) Kill() error {
	b, err := os.ReadFile(filepath.Join(u.Dir, "pid"))
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		return err
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// Handler serves the fake over Streamable HTTP.
func (u *Upstream) Handler() http.Handler {
	s := u.Server()
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
}

// ServeStdioIfAsked serves the fake over stdio and exits, when StdioEnv
// names a state directory: call it first in TestMain, so that the test
// binary is the upstream command the gateway starts. It writes its pid to
// the file pid there (see Kill), and will not start while the file down
// is there (see Down).
func ServeStdioIfAsked() {
	dir := os.Getenv(StdioEnv)
	if dir == "" {
		return
	}
	u := New(dir)
	if _, err := os.Stat(filepath.Join(dir, "down")); err == nil {
		fmt.Fprintln(os.Stderr, "mcptest: down")
		os.Exit(1)
	}
	if err := os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		panic(err)
	}
	err := u.Server().Run(context.Background(), &mcp.StdioTransport{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcptest:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
