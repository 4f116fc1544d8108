package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestFindAnswersWhatCreateAnswered: the gateway records find_ticket's
// answer as create_ticket's result when it settles a call with it, so a
// ticket found is what create_ticket answered (and fits its output
// schema); a key with no ticket is {"found": false}.
func TestFindAnswersWhatCreateAnswered(t *testing.T) {
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	if _, err := newServer().Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	// call returns a call's structured content and its text, read as JSON.
	call := func(name string, args map[string]any, meta mcp.Meta) string {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args, Meta: meta})
		if err != nil || res.IsError || len(res.Content) != 1 {
			t.Fatalf("%s: %v, %+v", name, err, res)
		}
		var text any
		if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &text); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal([]any{res.StructuredContent, text})
		return string(b)
	}
	created := call("create_ticket", map[string]any{"title": "Printer on fire", "priority": 2}, mcp.Meta{"idempotencyKey": "k-1"})
	for _, tc := range []struct {
		key, want string
	}{
		{"k-1", created},
		{"k-2", `[{"found":false},{"found":false}]`},
	} {
		if got := call("find_ticket", map[string]any{"idempotency_key": tc.key}, nil); got != tc.want {
			t.Errorf("find_ticket(%s) = %s, want %s", tc.key, got, tc.want)
		}
	}
}
