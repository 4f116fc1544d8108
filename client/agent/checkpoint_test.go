package agent_test

import (
	"context"
	"sync"
	"testing"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
	"github.com/opledger/ledger/internal/redistest"
)

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
