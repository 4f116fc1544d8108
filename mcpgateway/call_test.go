package mcpgateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/mcpgateway"
)

// createRules: create_ticket gives up after 1s and is reconciled by
// find_ticket.
const createRules = `
- match: create_ticket
  timeout: 1s
  probe: {tool: find_ticket, not_found_after: 1s}
`

var ticketArgs = map[string]any{"title": "Printer on fire", "priority": 2}

// TestRepeatedCallsApplyOnce (S9 through the gateway): an MCP client sends
// one create_ticket call 5 times, the first 2 at once, over stdio and over
// Streamable HTTP, with an operation id in _meta and without one (the
// session mode), while the upstream answers, loses its answer after the
// effect, or dies after it: the upstream applies the effect once, and
// every answer carries that ticket.
func TestRepeatedCallsApplyOnce(t *testing.T) {
	for _, downstream := range []string{"stdio", "http"} {
		for _, keyed := range []bool{true, false} {
			for _, fault := range []string{"none", "drop", "kill"} {
				t.Run(fmt.Sprintf("%s/keyed=%v/%s", downstream, keyed, fault), func(t *testing.T) {
					t.Parallel()
					r := newRig(t, rigOptions{rules: createRules})
					if fault != "none" {
						r.up.Fault("create_ticket", fault)
					}
					cs := r.session(downstream)
					var meta mcp.Meta
					if keyed {
						meta = mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "ticket")}
					}
					answers := concurrently(2, func(int) answer { return call(t, cs, "tickets_create_ticket", ticketArgs, meta) })
					for range 3 {
						answers = append(answers, call(t, cs, "tickets_create_ticket", ticketArgs, meta))
					}
					if n := r.up.Count("create_ticket"); n != 1 {
						t.Fatalf("the upstream applied the effect %d times, want once; answers %v", n, answers)
					}
					executed := 0
					for i, a := range answers {
						if a.isError || a.ticket != "T-1" || a.id() != answers[0].id() {
							t.Errorf("answer %d = %v, want ticket T-1 under one operation id", i, a)
						}
						if a.outcome() == "executed" {
							executed++
						}
					}
					if want := map[string]int{"none": 1, "drop": 0, "kill": 0}[fault]; executed != want {
						t.Errorf("%d answers say executed, want %d: %v", executed, want, answers)
					}
				})
			}
		}
	}
}

// session connects a client to the rig's gateway over downstream: stdio
// or http.
func (r *rig) session(downstream string) *mcp.ClientSession {
	if downstream == "stdio" {
		return r.stdio(clientOptions{})
	}
	return r.http("", clientOptions{})
}

// TestKeyedCalls: under one key, changed arguments are refused and never
// forwarded, and the refusal says what to do; a new key is a new effect.
func TestKeyedCalls(t *testing.T) {
	r := newRig(t, rigOptions{rules: createRules})
	cs := r.stdio(clientOptions{})
	k := key(t, "a")
	first := call(t, cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: k})
	changed := call(t, cs, "tickets_create_ticket", map[string]any{"title": "Printer on fire", "priority": 1}, mcp.Meta{mcpgateway.MetaIdempotencyKey: k})
	if !changed.isError || changed.outcome() != "key_reused" || !strings.Contains(changed.text, "send its original arguments unchanged") || !strings.Contains(changed.text, "params") {
		t.Fatalf("changed arguments under the key = %v, want key_reused telling what to do", changed)
	}
	if n := r.up.Calls("create_ticket"); n != 1 {
		t.Fatalf("the upstream got %d calls, want 1: the changed request must not be forwarded", n)
	}
	own := call(t, cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaOperationID: k})
	if own.ticket != first.ticket || own.outcome() != "replayed" {
		t.Fatalf("the same key under %s = %v, want the replay of %v", mcpgateway.MetaOperationID, own, first)
	}
	second := call(t, cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "b")})
	if second.isError || second.ticket != "T-2" || r.up.Count("create_ticket") != 2 {
		t.Fatalf("a new key = %v (%d effects), want a second ticket", second, r.up.Count("create_ticket"))
	}
	for _, meta := range []mcp.Meta{
		{mcpgateway.MetaIdempotencyKey: 7},
		{mcpgateway.MetaIdempotencyKey: ""},
		{mcpgateway.MetaIdempotencyKey: "a", mcpgateway.MetaOperationID: "b"},
		{mcpgateway.MetaIdempotencyKey: strings.Repeat("x", 300)},
	} {
		a := call(t, cs, "tickets_create_ticket", ticketArgs, meta)
		if !a.isError || a.outcome() != "invalid_request" {
			t.Errorf("_meta %v = %v, want invalid_request", meta, a)
		}
	}
	if n := r.up.Calls("create_ticket"); n != 2 {
		t.Fatalf("the upstream got %d calls, want 2", n)
	}
}

// TestSessionMode: without a key, the same call in one session is one
// operation within the window and a new one after it; another session, or
// other consequential arguments, is another operation; arguments the
// policy leaves out do not count.
func TestSessionMode(t *testing.T) {
	r := newRig(t, rigOptions{rules: `
- match: create_ticket
  window: 1s
  params: [/title]
`})
	cs := r.stdio(clientOptions{})
	a := call(t, cs, "tickets_create_ticket", ticketArgs, nil)
	b := call(t, cs, "tickets_create_ticket", map[string]any{"title": "Printer on fire", "priority": 5}, nil)
	if b.ticket != a.ticket || b.outcome() != "replayed" {
		t.Fatalf("a repeat with another priority (not consequential) = %v, want the replay of %v", b, a)
	}
	other := call(t, r.http("", clientOptions{}), "tickets_create_ticket", ticketArgs, nil)
	if other.ticket == a.ticket || other.id() == a.id() {
		t.Fatalf("the same call in another session = %v, want another operation than %v", other, a)
	}
	time.Sleep(1100 * time.Millisecond)
	late := call(t, cs, "tickets_create_ticket", ticketArgs, nil)
	if late.outcome() != "executed" || late.id() == a.id() || !strings.HasSuffix(late.id(), ":2") {
		t.Fatalf("a repeat after the window = %v, want a new operation (%s:2)", late, strings.TrimSuffix(a.id(), ":1"))
	}
	run := mcp.Meta{mcpgateway.MetaRunID: key(t, "run")}
	x := call(t, cs, "tickets_create_ticket", ticketArgs, run)
	y := call(t, r.http("", clientOptions{}), "tickets_create_ticket", ticketArgs, run)
	if y.ticket != x.ticket || y.outcome() != "replayed" {
		t.Fatalf("the same call under one run id in two sessions = %v then %v, want one operation", x, y)
	}
	if n := r.up.Count("create_ticket"); n != 4 {
		t.Fatalf("%d effects, want 4", n)
	}
}

// TestSessionModeAfterExpiry: a record of a session's intent that has
// expired (only its tombstone is left) counts as settled past the window,
// even one of an hour: the same call in that session is a new intent under
// the next id, not a refusal (docs/mcp.md).
func TestSessionModeAfterExpiry(t *testing.T) {
	r := newRig(t, rigOptions{rules: "- {match: create_ticket, window: 1h}",
		ledgerPolicy: "tools:\n  - match: \"*\"\n    retention: 1s\n    retain_grace: 0s\n    tombstone_retention: 1h\n"})
	cs := r.stdio(clientOptions{})
	first := call(t, cs, "tickets_create_ticket", ticketArgs, nil)
	if _, err := r.ledgerClient("").Lookup(context.Background(), first.id()); err != nil {
		t.Fatalf("the first intent's record: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := r.ledgerClient("").Lookup(context.Background(), first.id())
		if errors.Is(err, client.ErrKeyExpired) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first intent's record never expired: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	again := call(t, cs, "tickets_create_ticket", ticketArgs, nil)
	if again.outcome() != "executed" || !strings.HasSuffix(again.id(), ":2") || strings.TrimSuffix(again.id(), "2") != strings.TrimSuffix(first.id(), "1") {
		t.Fatalf("the same call after the record expired = %v, want a new operation after %s", again, first.id())
	}
	if n := r.up.Count("create_ticket"); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
}

// TestToolModes: a read-only tool is forwarded every time, unrecorded; a
// tool whose rule says require refuses a call without a key, telling what
// to send; an idempotent tool is recorded too.
func TestToolModes(t *testing.T) {
	r := newRig(t, rigOptions{rules: `
- match: create_ticket
  key: require
`})
	cs := r.stdio(clientOptions{})
	for range 3 {
		if a := call(t, cs, "tickets_search_tickets", map[string]any{"query": "printer"}, nil); a.isError || a.outcome() != "unrecorded" {
			t.Fatalf("search = %v", a)
		}
	}
	if n := r.up.Calls("search_tickets"); n != 3 {
		t.Fatalf("the read-only tool was forwarded %d times, want 3", n)
	}
	a := call(t, cs, "tickets_create_ticket", ticketArgs, nil)
	if !a.isError || a.outcome() != "key_required" || !strings.Contains(a.text, `"idempotencyKey"`) || r.up.Calls("create_ticket") != 0 {
		t.Fatalf("create without a key under require = %v", a)
	}
	k := key(t, "status")
	for range 2 {
		if a := call(t, cs, "tickets_set_status", map[string]any{"id": "T-1", "status": "closed"}, mcp.Meta{mcpgateway.MetaIdempotencyKey: k}); a.isError {
			t.Fatalf("set_status = %v", a)
		}
	}
	if n := r.up.Count("set_status"); n != 1 {
		t.Fatalf("set_status applied %d times, want once", n)
	}
	o, err := r.ledgerClient("").Lookup(context.Background(), k)
	if err != nil || o.Effect != client.EffectIdempotent || o.State != client.StateSucceeded {
		t.Fatalf("the record of set_status = %+v, %v: want an idempotent SUCCEEDED operation", o, err)
	}
}

// TestUpstreamOutcomes: what each way a forward ends is recorded as, and
// what the next call with the same key gets.
func TestUpstreamOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		upstream  string
		rules     string
		fault     string
		down      func(t *testing.T, r *rig)
		outcome   string // of the first call
		state     client.State
		again     string // outcome of the second call
		forwards  int    // calls the upstream got in all
		effects   int
		textHints []string
	}{
		{name: "error is final", fault: "error", outcome: "executed", state: client.StateFailedFinal, again: "replayed", forwards: 1,
			textHints: []string{"priority must be 1 to 5"}},
		{name: "error with structured content", fault: "error:structured", outcome: "executed", state: client.StateFailedFinal, again: "replayed", forwards: 1,
			textHints: []string{"priority must be 1 to 5"}},
		{name: "error is retryable", rules: "- {match: create_ticket, errors: retryable}", fault: "error", outcome: "not_applied", state: client.StatePending, again: "executed", forwards: 2, effects: 1},
		{name: "hang past the timeout", rules: "- {match: create_ticket, timeout: 500ms}", fault: "hang", outcome: "unknown", state: client.StateUnknown, again: "unknown", forwards: 1,
			textHints: []string{"unknown", "do not change its arguments or key"}},
		{name: "upstream not started", down: stopStdio, outcome: "not_applied", state: client.StatePending, again: "not_applied",
			textHints: []string{"nothing was applied", "could not be reached"}},
		{name: "connection refused", upstream: "http", down: stopHTTP, outcome: "not_applied", state: client.StatePending, again: "not_applied",
			textHints: []string{"could not be reached"}},
		{name: "upstream restarted, its sessions gone", upstream: "http", down: func(_ *testing.T, r *rig) { r.restartHTTP() },
			outcome: "executed", state: client.StateSucceeded, again: "replayed", forwards: 1, effects: 1},
		{name: "upstream restarted, answering 400 for its sessions", upstream: "http", down: func(_ *testing.T, r *rig) { r.goneAs400.Store(true); r.restartHTTP() },
			outcome: "executed", state: client.StateSucceeded, again: "replayed", forwards: 1, effects: 1},
		{name: "lines on stdout that are no messages", fault: "print", outcome: "executed", state: client.StateSucceeded, again: "replayed", forwards: 1, effects: 1},
		{name: "event streams ended while the tool runs", upstream: "http", fault: "slow:2s", down: cutStreams,
			outcome: "executed", state: client.StateSucceeded, again: "replayed", forwards: 1, effects: 1},
		{name: "event stream refused (405) while the tool runs", upstream: "http", fault: "slow:2s", down: refuseStreams,
			outcome: "executed", state: client.StateSucceeded, again: "replayed", forwards: 1, effects: 1},
		{name: "event streams with ids ended while the tool runs", upstream: "http-resumable", fault: "slow:2s", down: cutStreams,
			outcome: "executed", state: client.StateSucceeded, again: "replayed", forwards: 1, effects: 1},
		{name: "HTTP 429 before the tool", upstream: "http", down: refuseNext(http.StatusTooManyRequests), outcome: "not_applied",
			state: client.StatePending, again: "executed", forwards: 1, effects: 1, textHints: []string{"HTTP 429 Too Many Requests", "nothing was applied"}},
		{name: "answer over 16 MiB, stdio", fault: "huge", outcome: "unknown", state: client.StateUnknown, again: "unknown", forwards: 1, effects: 1,
			textHints: []string{"may or may not have applied it"}},
		{name: "answer over 16 MiB, event stream", upstream: "http", fault: "huge", outcome: "unknown", state: client.StateUnknown, again: "unknown", forwards: 1, effects: 1,
			textHints: []string{"may or may not have applied it"}},
		{name: "answer over 16 MiB, JSON", upstream: "http-json", fault: "huge", outcome: "unknown", state: client.StateUnknown, again: "unknown", forwards: 1, effects: 1,
			textHints: []string{"may or may not have applied it"}},
		{name: "HTTP 502 from a proxy", upstream: "http", down: refuseNext(http.StatusBadGateway), outcome: "unknown",
			state: client.StateUnknown, again: "unknown", forwards: 0, textHints: []string{"may or may not have applied it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, rigOptions{upstream: tc.upstream, rules: tc.rules})
			if tc.fault != "" {
				r.up.Fault("create_ticket", tc.fault)
			}
			cs := r.stdio(clientOptions{})
			if tc.down != nil {
				tc.down(t, r)
			}
			k := key(t, "op")
			first := call(t, cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: k})
			if first.outcome() != tc.outcome || tc.outcome != "executed" && !first.isError {
				t.Fatalf("first call = %v, want %s", first, tc.outcome)
			}
			for _, h := range tc.textHints {
				if !strings.Contains(first.text, h) {
					t.Errorf("first call's text %q does not say %q", first.text, h)
				}
			}
			o, err := r.ledgerClient("").Lookup(context.Background(), k)
			if err != nil || o.State != tc.state {
				t.Fatalf("record = %+v, %v: want %v", o, err, tc.state)
			}
			// The tool's text may quote its arguments: it is the failure's
			// detail, which no page shows, never its message.
			if o.State == client.StateFailedFinal && (o.Failure == nil || o.Failure.Message != "" || o.Failure.Detail != first.text) {
				t.Errorf("recorded failure %+v, want the tool's text %q as its detail alone", o.Failure, first.text)
			}
			second := call(t, cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: k})
			if second.outcome() != tc.again {
				t.Fatalf("second call = %v, want %s", second, tc.again)
			}
			if tc.again == "replayed" && (second.text != first.text || second.isError != first.isError) {
				t.Errorf("the replay %v differs from the first answer %v", second, first)
			}
			if n, m := r.up.Calls("create_ticket"), r.up.Count("create_ticket"); n != tc.forwards || m != tc.effects {
				t.Fatalf("the upstream got %d calls and applied %d effects, want %d and %d", n, m, tc.forwards, tc.effects)
			}
		})
	}
}

// cutStreams has the HTTP upstream end its GET event streams, the one
// open now and each one after it, a moment after they start: more than
// go-sdk's 5 in a row by the end of the test. A new tool sends an event
// down the stream, after which a resumable upstream's streams are asked
// for with its id.
func cutStreams(t *testing.T, r *rig) {
	r.cutStreams.Store(true)
	r.httpUpstream.CloseClientConnections()
	r.server.AddTool(&mcp.Tool{Name: "noop", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
	t.Cleanup(func() {
		if n, resumed := r.streamsCut.Load(), r.streamsResumed.Load(); n < 10 || (resumed >= n/2) != r.resumable {
			t.Errorf("%d event streams cut, %d of them resumed after an event; want 10 or more, most resumed when the upstream resumes streams, else none", n, resumed)
		}
	})
}

// refuseStreams has the HTTP upstream end its GET event streams a moment
// after they start, and, once a call is in flight, answer the GETs after
// them 405, as a server that stopped offering the stream does.
func refuseStreams(t *testing.T, r *rig) {
	r.cutStreams.Store(true)
	r.httpUpstream.CloseClientConnections()
	go func() {
		for r.up.Calls("create_ticket") == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		r.refuseStreams.Store(true)
	}()
	t.Cleanup(func() {
		if n := r.streamsRefused.Load(); n == 0 {
			t.Error("no event stream was refused")
		}
	})
}

// refuseNext has the HTTP upstream answer its next tools/call with status.
func refuseNext(status int) func(*testing.T, *rig) {
	return func(_ *testing.T, r *rig) { r.refuse.Store(int32(status)) }
}

// TestLedgerOutcomes: what a caller gets when the ledger cannot take a
// call, refuses it, holds it for another call still running, or goes away
// while the tool runs; the upstream is not called, or only by the call
// that holds the operation.
func TestLedgerOutcomes(t *testing.T) {
	creds, viewers := apiKeys(t, "viewer", "acme")
	for _, tc := range []struct {
		name     string
		opts     rigOptions
		during   func(t *testing.T, r *rig, cs *mcp.ClientSession, k string) answer // the first call, while another runs
		outcome  string
		text     string
		forwards int
		answered bool // the tool's own answer, not an error
	}{
		{name: "ledger unreachable", opts: rigOptions{ledgerAddr: ledgertest.ClosedAddr(t), rules: "- {match: create_ticket, wait: 2s}"},
			outcome: "unavailable", text: "could not be reached, and nothing runs without it"},
		{name: "credentials refused", opts: rigOptions{creds: creds, apiKeyEnv: "GW_KEY", env: map[string]string{"GW_KEY": viewers["acme"]}},
			outcome: "refused", text: "the ledger refused the gateway's credentials"},
		{name: "key none on a tool that changes things", opts: rigOptions{rules: "- {match: create_ticket, key: none}"},
			outcome: "misconfigured", text: "An operator must fix its policy"},
		{name: "another call still running", opts: rigOptions{rules: "- {match: create_ticket, wait: 300ms}"},
			during: stillRunning, outcome: "in_progress", text: "another call of this operation is still running", forwards: 1},
		// A lease longer than the tool takes: the gateway, whose renewals
		// fail, does not stop the tool first.
		{name: "ledger gone while the tool runs", opts: rigOptions{ledgerPolicy: "tools:\n  - {match: \"*\", lease: 20s}\n"},
			during: ledgerGone("slow:3s"), outcome: "not_recorded", text: "Opened ticket T-", forwards: 1, answered: true},
		// The tool applies its effect and never answers: its outcome is
		// unknown, and the ledger, gone, cannot record even that.
		{name: "ledger gone while the tool's answer is lost", opts: rigOptions{ledgerPolicy: "tools:\n  - {match: \"*\", lease: 20s}\n",
			rules: "- {match: create_ticket, timeout: 2s}"},
			during: ledgerGone("drop"), outcome: "unknown", text: "the tool may or may not have applied it", forwards: 1},
		// An idempotent tool's first forward is lost, its second proven not
		// applied: the first may still have applied the effect.
		{name: "ledger gone after a lost forward and one not applied", opts: rigOptions{ledgerPolicy: "tools:\n  - {match: \"*\", lease: 20s}\n",
			rules: "- {match: create_ticket, effect: idempotent, timeout: 3s, retries: 2, errors: retryable}"},
			during: ledgerGone("drop", "error:1500ms"), outcome: "unknown", text: "the tool may or may not have applied it", forwards: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, tc.opts)
			cs := r.stdio(clientOptions{})
			k := key(t, "op")
			var a answer
			if tc.during != nil {
				a = tc.during(t, r, cs, k)
			} else {
				a = call(t, cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: k})
			}
			if a.isError == tc.answered || a.outcome() != tc.outcome || !strings.Contains(a.text, tc.text) {
				t.Fatalf("call = %v, want %s saying %q (the tool's answer: %v)", a, tc.outcome, tc.text, tc.answered)
			}
			if n := r.up.Calls("create_ticket"); n != tc.forwards {
				t.Fatalf("the upstream got %d calls, want %d", n, tc.forwards)
			}
		})
	}
}

// ledgerGone makes a call of operation k, the tool given fault, and
// stops the ledger while the tool runs: the tool applies its effect, the
// ledger cannot record its outcome (the gateway tries again, then gives
// up), and the caller is answered all the same.
func ledgerGone(faults ...string) func(t *testing.T, r *rig, cs *mcp.ClientSession, k string) answer {
	return func(t *testing.T, r *rig, cs *mcp.ClientSession, k string) answer {
		t.Helper()
		return ledgerGoneWith(t, r, cs, k, faults)
	}
}

// ledgerGoneWith stops the ledger once the upstream got one call per
// fault.
func ledgerGoneWith(t *testing.T, r *rig, cs *mcp.ClientSession, k string, faults []string) answer {
	t.Helper()
	r.up.Fault("create_ticket", faults...)
	done := callLater(cs, mcp.Meta{mcpgateway.MetaIdempotencyKey: k})
	waitForCalls(t, r, len(faults))
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stop at once
	r.ledger.Service.Shutdown(ctx)
	a := <-done
	if n := r.up.Count("create_ticket"); n != 1 {
		t.Fatalf("the upstream applied %d effects, want 1", n)
	}
	return a
}

// waitForCalls waits until the upstream got n calls of create_ticket.
func waitForCalls(t *testing.T, r *rig, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); r.up.Calls("create_ticket") < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the call did not reach the upstream")
		}
	}
}

// stillRunning makes a call of operation k that runs for 5 seconds, and
// returns the answer to the same call made while it runs. Once the first
// ends, the operation has one effect, which a third call replays.
func stillRunning(t *testing.T, r *rig, cs *mcp.ClientSession, k string) answer {
	t.Helper()
	r.up.Fault("create_ticket", "slow:5s")
	meta := mcp.Meta{mcpgateway.MetaIdempotencyKey: k}
	first := callLater(cs, meta)
	waitForCalls(t, r, 1)
	second := call(t, cs, "tickets_create_ticket", ticketArgs, meta)
	if a := <-first; a.isError || a.outcome() != "executed" {
		t.Fatalf("the first call = %v, want executed", a)
	}
	if a := call(t, cs, "tickets_create_ticket", ticketArgs, meta); a.outcome() != "replayed" || r.up.Count("create_ticket") != 1 {
		t.Fatalf("a third call = %v with %d effects, want the replay of one", a, r.up.Count("create_ticket"))
	}
	return second
}

// TestAnswersFitTheOutputSchema: create_ticket lists an output schema, and
// every answer passes the check the official clients make of it (call
// does it). What the tool answered in its shape is answered, and replayed,
// as it is, and so is data an operator typed in that shape. A result of
// another shape (the tool's, an operator's, one too large to keep) is
// answered as text, saying the call succeeded and will not run again, and
// counted by why.
func TestAnswersFitTheOutputSchema(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rules   string
		fault   string
		finding *client.Finding // an operator's, once the first call ended
		first   string          // the first call's outcome
		ticket  string          // the answers' structured id, after the operator's finding if any
		says    []string        // the text of the answers after the first
		effects int
		asText  string // ledgermcp_answers_as_text_total's series after both calls, if any
	}{
		{name: "the tool's shape", first: "executed", ticket: "T-1", says: []string{"Opened ticket T-1."}, effects: 1},
		{name: "another shape from the tool", fault: "shape", first: "executed",
			says: []string{"ran and succeeded", "will not run again", "the tool answered so", "Opened ticket T-1."}, effects: 1,
			asText: `{reason="shape",tool="tickets_create_ticket"} 2`},
		{name: "recorded by an operator", rules: "- {match: create_ticket, timeout: 500ms}", fault: "hang", first: "unknown",
			finding: &client.Finding{Kind: client.Applied, Result: client.Result{ResourceID: "T-9", Data: map[string]any{"ticket": "T-9", "desk": "opened by hand"}}, Note: "INC-7"},
			says:    []string{"ran and succeeded", "will not run again", `"ticket":"T-9"`, "opened by hand"},
			asText:  `{reason="shape",tool="tickets_create_ticket"} 1`},
		{name: "recorded by an operator in the tool's shape", rules: "- {match: create_ticket, timeout: 500ms}", fault: "hang", first: "unknown",
			finding: &client.Finding{Kind: client.Applied, Result: client.Result{ResourceID: "T-9", Data: map[string]any{"id": "T-9", "title": "Printer on fire"}}, Note: "INC-8"},
			ticket:  "T-9", says: []string{`"resourceId":"T-9"`}},
		{name: "an id no resource id may be", rules: "- {match: create_ticket, resource_id: /id}", fault: "newline", first: "executed",
			ticket: "T-1\n", says: []string{"Opened ticket T-1."}, effects: 1},
		{name: "too deep to keep", fault: "deep", first: "executed", ticket: "T-1", says: []string{"ran and succeeded", "nested too deeply for the ledger to keep"}, effects: 1,
			asText: `{reason="missing",tool="tickets_create_ticket"} 1`},
		{name: "too large to keep", fault: "big", first: "executed", ticket: "T-1", says: []string{"ran and succeeded", "too large for the ledger to keep"}, effects: 1,
			asText: `{reason="missing",tool="tickets_create_ticket"} 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, rigOptions{rules: tc.rules})
			if tc.fault != "" {
				r.up.Fault("create_ticket", tc.fault)
			}
			cs := r.stdio(clientOptions{})
			meta := mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "op")}
			first := call(t, cs, "tickets_create_ticket", ticketArgs, meta)
			if first.outcome() != tc.first || tc.finding == nil && first.ticket != tc.ticket {
				t.Fatalf("first call = %v, want %s with ticket %q", first, tc.first, tc.ticket)
			}
			if tc.finding != nil {
				if _, err := r.ledgerClient("").Reconcile(context.Background(), meta[mcpgateway.MetaIdempotencyKey].(string), *tc.finding); err != nil {
					t.Fatal(err)
				}
			}
			a := call(t, cs, "tickets_create_ticket", ticketArgs, meta)
			if tc.fault == "big" || tc.fault == "deep" {
				tc.ticket = "" // the note kept in its place has no ticket
			}
			if a.outcome() != "replayed" || a.ticket != tc.ticket || a.isError != (tc.ticket == "") {
				t.Fatalf("the replay = %v, want replayed with ticket %q", a, tc.ticket)
			}
			for _, s := range tc.says {
				if !strings.Contains(a.text, s) {
					t.Errorf("the replay's text %q does not say %q", a.text, s)
				}
			}
			if tc.fault == "shape" && first.text != a.text {
				t.Errorf("the first answer %q is not the replay's %q", first.text, a.text)
			}
			if n, m := r.up.Calls("create_ticket"), r.up.Count("create_ticket"); n != 1 || m != tc.effects {
				t.Fatalf("the upstream got %d calls and applied %d effects, want 1 and %d", n, m, tc.effects)
			}
			const metric = "ledgermcp_answers_as_text_total"
			text := scrape(t, r.gw)
			if counted := strings.Contains(text, metric+"{"); counted != (tc.asText != "") || counted && !strings.Contains(text, metric+tc.asText) {
				t.Errorf("the metrics lack %s%s:\n%s", metric, tc.asText, text)
			}
			if logs := r.log.String(); strings.Contains(logs, "without its structured content") != (tc.asText != "") ||
				strings.Contains(logs, "Printer") || strings.Contains(logs, "T-9") {
				t.Errorf("the log, for an answer given as text, says it without the answer:\n%s", logs)
			}
		})
	}
}

// stopStdio kills the stdio upstream and keeps it from starting again,
// and waits for the gateway to see its session end.
func stopStdio(t *testing.T, r *rig) {
	r.up.Down()
	if err := r.up.Kill(); err != nil {
		t.Fatal(err)
	}
	r.waitLog(t, "upstream session ended")
}

// stopHTTP stops the HTTP upstream: its port refuses connections.
func stopHTTP(t *testing.T, r *rig) {
	r.httpUpstream.CloseClientConnections()
	r.httpUpstream.Close()
}

// waitLog waits until the gateway's log holds s.
func (r *rig) waitLog(t *testing.T, s string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(r.log.String(), s); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the gateway's log:\n%s", s, r.log.String())
		}
	}
}

// TestRunGuard: calls under one run id (from _meta, or the session's)
// are counted by the ledger's run guard: past the run's cap a call is
// refused, never forwarded, with run_ended and what to do; a retry of an
// admitted call still replays.
func TestRunGuard(t *testing.T) {
	r := newRig(t, rigOptions{rules: createRules})
	lc := r.ledgerClient("")
	run := key(t, "run")
	if _, err := lc.StartRun(context.Background(), run, client.RunLimits{MaxSteps: 2}); err != nil {
		t.Fatal(err)
	}
	cs := r.stdio(clientOptions{})
	meta := func(k string) mcp.Meta {
		return mcp.Meta{mcpgateway.MetaRunID: run, mcpgateway.MetaIdempotencyKey: key(t, k)}
	}
	title := func(s string) map[string]any { return map[string]any{"title": s, "priority": 2} }
	ma := meta("a")
	first := call(t, cs, "tickets_create_ticket", title("a"), ma)
	call(t, cs, "tickets_create_ticket", title("b"), meta("b"))
	third := call(t, cs, "tickets_create_ticket", title("c"), meta("c"))
	if !third.isError || third.outcome() != "run_ended" || third.ledger["runState"] != "step_limit" || third.ledger["limit"] != "max_steps" ||
		!strings.Contains(third.text, "Stop the run") {
		t.Fatalf("a call past the run's cap = %v, want run_ended (step_limit, max_steps)", third)
	}
	if again := call(t, cs, "tickets_create_ticket", title("a"), ma); again.outcome() != "replayed" || again.ticket != first.ticket {
		t.Fatalf("a retry of an admitted call = %v, want the replay of %v", again, first)
	}
	if n := r.up.Calls("create_ticket"); n != 2 {
		t.Fatalf("the upstream got %d calls, want 2", n)
	}
	got, err := lc.GetRun(context.Background(), run)
	if err != nil || got.State != client.RunStepLimit || got.Steps != 2 {
		t.Fatalf("the run = %+v, %v", got, err)
	}
	// Without a run id in _meta the session is the run.
	own := call(t, cs, "tickets_create_ticket", title("d"), mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "d")})
	if op, err := lc.Lookup(context.Background(), own.id()); err != nil || !strings.HasPrefix(op.RunID, "stdio-") {
		t.Fatalf("a call without a run id: %+v, %v; want the stdio session's run", op, err)
	}
}

// TestOneCallFailsAlone: a call a proxy refuses with a status that proves
// it was not processed is not applied, and one whose JSON answer is over
// 16 MiB is unknown; the call in flight on the same upstream session
// meanwhile is answered as it ends.
func TestOneCallFailsAlone(t *testing.T) {
	for _, tc := range []struct {
		name, upstream string
		status         int    // a proxy's answer to the second call
		fault          string // the second call's
		outcome, says  string
		effects        int
	}{
		{name: "403", upstream: "http", status: http.StatusForbidden, outcome: "not_applied", says: "HTTP 403 Forbidden", effects: 1},
		{name: "413", upstream: "http", status: http.StatusRequestEntityTooLarge, outcome: "not_applied", says: "HTTP 413 Request Entity Too Large", effects: 1},
		{name: "431", upstream: "http", status: http.StatusRequestHeaderFieldsTooLarge, outcome: "not_applied", says: "HTTP 431 Request Header Fields Too Large", effects: 1},
		{name: "JSON answer over 16 MiB", upstream: "http-json", fault: "huge", outcome: "unknown", says: "may or may not have applied it", effects: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, rigOptions{upstream: tc.upstream})
			r.up.Fault("create_ticket", "slow:1s", tc.fault)
			cs := r.stdio(clientOptions{})
			running := callLater(cs, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "running")})
			for r.up.Calls("create_ticket") == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			r.refuse.Store(int32(tc.status))
			if a := call(t, cs, "tickets_create_ticket", ticketArgs, mcp.Meta{mcpgateway.MetaIdempotencyKey: key(t, "second")}); a.outcome() != tc.outcome || !strings.Contains(a.text, tc.says) {
				t.Fatalf("the second call = %v, want %s, saying %q", a, tc.outcome, tc.says)
			}
			if a := <-running; a.outcome() != "executed" {
				t.Fatalf("the call in flight = %v, want executed", a)
			}
			if n := r.up.Count("create_ticket"); n != tc.effects {
				t.Fatalf("%d effects, want %d", n, tc.effects)
			}
		})
	}
}
