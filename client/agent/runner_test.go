package agent_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Arguments built in Go with typed slices and maps ([]string,
// map[string]string, []int) are converted to JSON values, as results are:
// the mutating tool runs once and its operation is fingerprinted as the
// same arguments in JSON form, so a resumed run whose transcript came back
// from JSON storage replays the call instead of being refused as another
// request under the same key. Integers a double cannot carry exactly are
// still refused.
func TestTypedArgumentsAreConvertedToJSONValues(t *testing.T) {
	env := startLedger(t, redistest.Shared(t).Client(t))
	var runs, reads atomic.Int32
	tools := []agent.Tool{
		{Name: "tag", Mutating: true, Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			runs.Add(1)
			return client.Result{ResourceID: "t-1"}, nil
		}},
		{Name: "find", Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
			reads.Add(1)
			return client.Result{ResourceID: "f-1"}, nil
		}},
	}
	typed := map[string]any{"ids": []string{"a", "b"}, "labels": map[string]string{"k": "v"}, "counts": []int{1, 2}}
	asJSON := map[string]any{"ids": []any{"a", "b"}, "labels": map[string]any{"k": "v"}, "counts": []any{1.0, 2.0}}
	run := func(runID string, args map[string]any) agent.Outcome {
		calls := []agent.ToolCall{{ID: "call-1", Name: "tag", Args: args}, {ID: "call-2", Name: "find", Args: args}}
		model := agent.ModelFunc(func(ctx context.Context, tr []agent.Message) (agent.Turn, error) {
			if len(results(tr)) == len(calls) {
				return agent.Turn{Text: "done"}, nil
			}
			return agent.Turn{Calls: calls}, nil
		})
		return mustNew(t, agent.Config{Client: env.client, Model: model, Tools: tools}).
			Run(context.Background(), agent.Input{RunID: runID, PermitID: "p", Transcript: user("tag them")})
	}
	runID := newRunID(t)
	out := run(runID, typed)
	if res := results(out.Transcript); out.Status != agent.StatusDone || len(res) != 2 || res[0].Error != "" || res[1].Error != "" {
		t.Fatalf("status %q (%v), results %+v; want both calls run", out.Status, out.Err, res)
	}
	if runs.Load() != 1 || reads.Load() != 1 {
		t.Fatalf("tag ran %d times, find %d; want 1 and 1", runs.Load(), reads.Load())
	}
	op, err := env.client.Lookup(context.Background(), runID+":call-1")
	if err != nil || op.State != client.StateSucceeded {
		t.Fatalf("operation = %+v, %v; want SUCCEEDED", op, err)
	}
	want, err := fingerprint.Compute(asJSON, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := op.ParamsSHA256; string(got) != string(want[:]) {
		t.Fatalf("params_sha256 = %x, want the JSON form's %x", got, want[:])
	}
	// The same run again, its arguments as JSON storage gives them back:
	// replayed, not run again.
	out = run(runID, asJSON)
	if res := results(out.Transcript); out.Status != agent.StatusDone || len(res) != 2 || !res[0].Replayed || res[0].Error != "" {
		t.Fatalf("again: status %q (%v), results %+v; want the call replayed", out.Status, out.Err, res)
	}
	if runs.Load() != 1 {
		t.Fatalf("tag ran %d times, want 1", runs.Load())
	}
	// An integer the wire's doubles would round is still refused.
	out = run(newRunID(t), map[string]any{"ids": []int64{1<<53 + 1}})
	if res := results(out.Transcript); len(res) != 2 || res[0].Error == "" || res[1].Error == "" || runs.Load() != 1 {
		t.Fatalf("status %q, results %+v, tag ran %d times; want both refused", out.Status, res, runs.Load())
	}
}

// ctxStore is a durable store of transcripts that honours its context, as
// a database client does: nothing is saved on a context that has ended.
type ctxStore struct {
	mu    sync.Mutex
	saved []agent.Message
}

func (s *ctxStore) save(ctx context.Context, runID string, transcript []agent.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.saved = transcript
	return nil
}

func (s *ctxStore) load() []agent.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saved
}

// The caller's context ends right after a mutating tool applied its
// effect: the ledger records it (Do reports past the caller's end), and so
// must the checkpoint, or a runtime resuming from the saved transcript
// would not know the effect happened. The run then ends for the ended
// context, and resuming from what was saved runs nothing again.
func TestCheckpointRecordsAnEffectAfterTheCallerGaveUp(t *testing.T) {
	env := startLedger(t, redistest.Shared(t).Client(t))
	dest := newDestination()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	book := bookTool(dest)
	apply := book.Func
	book.Func = func(c context.Context, call agent.Call) (res client.Result, err error) {
		res, err = apply(c, call)
		cancel() // the caller gives up as the effect lands
		return res, err
	}
	call := agent.ToolCall{ID: "call-1", Name: "book", Args: map[string]any{"slot": "09:30"}}
	store := &ctxStore{}
	runID := newRunID(t)
	r := mustNew(t, agent.Config{Client: env.client, Model: callOnceThenAnswer(call), Tools: []agent.Tool{book}, Checkpoint: store.save})
	out := r.Run(ctx, agent.Input{RunID: runID, PermitID: "p", Transcript: user("book 9:30")})
	if dest.total() != 1 {
		t.Fatalf("booked %d times, want 1", dest.total())
	}
	saved := results(store.load())
	if len(saved) != 1 || saved[0].ResourceID != "res-1" {
		t.Fatalf("saved results %+v (run: %q, %s, %v); want the booking's", saved, out.Status, out.Reason, out.Err)
	}
	// Resumed from what was saved: the model gets its answer, nothing runs.
	out = r.Run(context.Background(), agent.Input{RunID: runID, PermitID: "p", Transcript: store.load()})
	if out.Status != agent.StatusDone || dest.total() != 1 {
		t.Fatalf("resumed: %q (%v), booked %d times; want done, 1", out.Status, out.Err, dest.total())
	}
}

// Secret-looking values that must never reach the logs.
var secrets = []string{
	"hunter2-user-password",       // in the user's message
	"sk_live_51HxSECRETkey9f8e",   // argument of a read tool
	"alice.secret@example.com",    // argument of a read tool
	"4111111111111111",            // argument of a mutating tool
	"CVV-SECRET-737",              // argument of a mutating tool
	"078-05-1120-RESULT",          // result data of the read tool
	"ch_RESULT_SECRET_ID",         // resource id of the mutating tool
	"declined-SECRET-detail",      // error message of a failed attempt
	"final-answer-SECRET-text",    // the model's final answer
	"model-text-SECRET-reasoning", // the model's text with calls
}

// The logging contract: exactly one tool_start and one tool_end record per
// attempt (a retried mutating call has two attempts; a replayed call that
// runs no attempt gets one pair with replayed=true), with exactly the
// documented attributes, and never an argument value, result, error text,
// user message or model text.
func TestLoggingContract(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		env := startLedger(t, rdb)
		var logs ledgertest.Buffer
		logger := slog.New(slog.NewJSONHandler(&logs, nil))

		readArgs := map[string]any{"api_key": secrets[1], "email": secrets[2]}
		chargeArgs := map[string]any{"card": secrets[3], "cvv": secrets[4], "amount": 4200}
		var chargeRuns atomic.Int32
		tools := []agent.Tool{
			{Name: "lookup_customer", Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
				return client.Result{Data: map[string]any{"ssn": secrets[5]}}, nil
			}},
			{Name: "charge", Mutating: true, Policy: client.ToolPolicy{Timeout: 5 * time.Second, MaxRetries: 2},
				Func: func(ctx context.Context, c agent.Call) (client.Result, error) {
					if chargeRuns.Add(1) == 1 {
						return client.Result{}, client.MarkRetryable(errors.New(secrets[7]))
					}
					return client.Result{ResourceID: secrets[6], Data: map[string]any{"last4": secrets[3]}}, nil
				}},
		}
		m := agent.ModelFunc(func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
			switch turns(transcript) {
			case 0:
				return agent.Turn{Text: secrets[9], Calls: []agent.ToolCall{
					{ID: "c-read", Name: "lookup_customer", Args: readArgs},
					{ID: "c-pay", Name: "charge", Args: chargeArgs},
				}}, nil
			case 1: // the same call id again: replayed by the ledger
				return agent.Turn{Calls: []agent.ToolCall{{ID: "c-pay", Name: "charge", Args: chargeArgs}}}, nil
			}
			return agent.Turn{Text: secrets[8]}, nil
		})
		runID := newRunID(t)
		r := mustNew(t, agent.Config{Client: env.client, Model: m, Tools: tools, Logger: logger})
		out := r.Run(context.Background(), agent.Input{RunID: runID, Transcript: user("my password is " + secrets[0])})
		if out.Status != agent.StatusDone {
			t.Fatalf("status %q (%s, %v)", out.Status, out.Reason, out.Err)
		}
		if chargeRuns.Load() != 2 {
			t.Fatalf("charge ran %d times, want 2 (a refusal, then success)", chargeRuns.Load())
		}

		text := logs.String()
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("the logs contain the secret %q:\n%s", s, text)
			}
		}

		sha := func(args map[string]any) string {
			fp, err := fingerprint.Compute(args, nil)
			if err != nil {
				t.Fatal(err)
			}
			return fp.String()
		}
		startKeys := []string{"args_sha256", "attempt", "call_id", "level", "msg", "replayed", "run_id", "step", "time", "tool"}
		endKeys := append(slices.Clone(startKeys), "duration_ms", "ok")
		slices.Sort(endKeys)

		type attempt struct {
			step     float64
			callID   string
			attempt  float64
			replayed bool
		}
		starts, ends := map[attempt]int{}, map[attempt]int{}
		oks := map[attempt]bool{}
		var runEnds int
		sc := bufio.NewScanner(strings.NewReader(text))
		for sc.Scan() {
			var rec map[string]any
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				t.Fatalf("not JSON: %q", sc.Text())
			}
			msg := rec["msg"]
			if msg == "run_end" {
				runEnds++
				if rec["status"] != "done" || rec["run_id"] != runID {
					t.Errorf("run_end = %v", rec)
				}
				continue
			}
			if msg != "tool_start" && msg != "tool_end" {
				t.Errorf("unexpected record %v", rec)
				continue
			}
			keys := make([]string, 0, len(rec))
			for k := range rec {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			want := startKeys
			if msg == "tool_end" {
				want = endKeys
			}
			if !slices.Equal(keys, want) {
				t.Errorf("%s has attributes %v, want %v", msg, keys, want)
			}
			if rec["run_id"] != runID || rec["level"] != "INFO" {
				t.Errorf("record %v", rec)
			}
			wantSHA := sha(readArgs)
			if rec["tool"] == "charge" {
				wantSHA = sha(chargeArgs)
			}
			if rec["args_sha256"] != wantSHA {
				t.Errorf("%s args_sha256 = %v, want %s", msg, rec["args_sha256"], wantSHA)
			}
			a := attempt{rec["step"].(float64), rec["call_id"].(string), rec["attempt"].(float64), rec["replayed"].(bool)}
			if msg == "tool_start" {
				starts[a]++
			} else {
				ends[a]++
				oks[a] = rec["ok"].(bool)
				if d, ok := rec["duration_ms"].(float64); !ok || d < 0 {
					t.Errorf("duration_ms = %v", rec["duration_ms"])
				}
			}
		}
		want := map[attempt]bool{ // attempt -> ok
			{1, "c-read", 1, false}: true,
			{1, "c-pay", 1, false}:  false, // refused
			{1, "c-pay", 2, false}:  true,
			{2, "c-pay", 2, true}:   true, // replayed: no attempt ran
		}
		if len(starts) != len(want) || len(ends) != len(want) {
			t.Errorf("start records %v, end records %v; want one each for %v", starts, ends, want)
		}
		for a, ok := range want {
			if starts[a] != 1 || ends[a] != 1 || oks[a] != ok {
				t.Errorf("attempt %+v: %d starts, %d ends, ok=%v; want 1, 1, ok=%v", a, starts[a], ends[a], oks[a], ok)
			}
		}
		if runEnds != 1 {
			t.Errorf("%d run_end records, want 1", runEnds)
		}
		if t.Failed() {
			t.Log(text)
		}
	})
}
