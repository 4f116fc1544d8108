package mcpgateway_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/mcpgateway"
)

// TestBackgroundReconciliation: a call the caller gives up on after its
// forward leaves the operation UNKNOWN; the gateway's background pass asks
// the probe: an effect found is recorded and replayed to the next call;
// one not found is not applied once not_found_after has passed (before
// that it stays UNKNOWN), and the next call runs it; a tool without a
// probe, or an operation escalated to a human, stays UNKNOWN for an
// operator.
func TestBackgroundReconciliation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rules    string
		fault    string
		escalate bool
		settled  client.State  // what the pass makes of it
		next     string        // the next call's outcome
		effects  int           // in all
		stays    time.Duration // how long it stays UNKNOWN at least
	}{
		{name: "found", rules: createRules, fault: "drop", settled: client.StateSucceeded, next: "replayed", effects: 1},
		{name: "not found", rules: createRules, fault: "hang", settled: client.StatePending, next: "executed", effects: 1, stays: 700 * time.Millisecond},
		{name: "no probe", rules: "- {match: create_ticket, timeout: 1s}", fault: "drop", settled: client.StateUnknown, next: "unknown", effects: 1, stays: 2 * time.Second},
		{name: "escalated", rules: createRules, fault: "drop", escalate: true, settled: client.StateUnknown, next: "unknown", effects: 1, stays: 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, rigOptions{rules: tc.rules})
			cs := r.stdio(clientOptions{})
			lc := r.ledgerClient("")
			k := key(t, "lost")
			meta := mcp.Meta{mcpgateway.MetaIdempotencyKey: k}
			r.up.Fault("create_ticket", tc.fault)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "tickets_create_ticket", Arguments: ticketArgs, Meta: meta}); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the call given up on = %v", err)
			}
			waitState(t, lc, k, client.StateUnknown, nil)
			unknownAt := time.Now()
			if tc.escalate {
				if _, err := lc.Reconcile(context.Background(), k, client.Finding{Kind: client.Escalate, Note: "a human looks"}); err != nil {
					t.Fatal(err)
				}
			}
			settled := waitState(t, lc, k, tc.settled, func(o *client.Operation) {
				if time.Since(unknownAt) < tc.stays && o.State != client.StateUnknown {
					t.Fatalf("%v after %s, want UNKNOWN for %s at least", o.State, time.Since(unknownAt), tc.stays)
				}
			})
			if time.Since(unknownAt) < tc.stays {
				if tc.settled != client.StateUnknown {
					t.Fatalf("%v after %s, want UNKNOWN for %s at least", settled.State, time.Since(unknownAt), tc.stays)
				}
				time.Sleep(tc.stays - time.Since(unknownAt)) // background passes
				if o, err := lc.Lookup(context.Background(), k); err != nil || o.State != client.StateUnknown || o.NeedsReview != tc.escalate {
					t.Fatalf("after %s: %+v, %v; want UNKNOWN, needs review %v", tc.stays, o, err, tc.escalate)
				}
			}
			a := call(t, cs, "tickets_create_ticket", ticketArgs, meta)
			if a.outcome() != tc.next || tc.next != "unknown" && a.ticket != "T-1" {
				t.Fatalf("the next call = %v, want %s with T-1", a, tc.next)
			}
			if n := r.up.Count("create_ticket"); n != tc.effects {
				t.Fatalf("%d effects, want %d", n, tc.effects)
			}
		})
	}
}

// waitState polls the operation id until it is in state, calling each
// (when set) with every other state seen, and returns it.
func waitState(t *testing.T, lc *client.Client, id string, state client.State, each func(*client.Operation)) *client.Operation {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		o, err := lc.Lookup(context.Background(), id)
		if err == nil && o.State == state {
			return o
		}
		if err == nil && each != nil {
			each(o)
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s = %+v, %v; want %v", id, o, err, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
