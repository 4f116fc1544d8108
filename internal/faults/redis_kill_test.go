package faults

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// lostAcks looks every operation with an acknowledged write up and returns
// how many acknowledged writes the store no longer shows, and how many it
// checked, by kind. A record only moves forward (attempt and token grow; a
// terminal state stays), so what an acknowledgement showed is a floor the
// record must still be at, however far the load has moved it since:
//   - the record exists;
//   - its attempt is at least the acknowledged one; at the same attempt, the
//     token is the same;
//   - an acknowledged terminal state is still the state, at the same
//     attempt (no claim follows a terminal state), with one exception
//     (supersededBySuccess): a FAILED_FINAL the ledger or a reconciler
//     concluded may since have been turned into SUCCEEDED by the attempt's
//     late success;
//   - at the same attempt, an acknowledged PENDING or UNKNOWN (a retryable
//     Complete, MarkUnknown, Reconcile) is not RUNNING again.
//
// report receives a description of each lost write.
func lostAcks(ctx context.Context, t testing.TB, c *client.Client, acks []ack, report func(string)) (lost int, checked map[string]int) {
	t.Helper()
	byID := map[string][]ack{}
	checked = map[string]int{}
	for _, a := range acks {
		byID[a.ID] = append(byID[a.ID], a)
		checked[kindNames[a.Kind]]++
	}
	for id, as := range byID {
		var o *client.Operation
		var err error
		for range 100 {
			if o, err = c.Lookup(ctx, id); err == nil || !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
				break
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
		for _, a := range as {
			var why string
			switch {
			case errors.Is(err, client.ErrNotFound):
				why = "the record is gone"
			case err != nil:
				t.Fatalf("Lookup(%s): %v", id, err)
			case o.Attempt < a.Attempt:
				why = fmt.Sprintf("the record is at attempt %d", o.Attempt)
			case o.Attempt == a.Attempt && o.FencingToken != a.Token:
				why = fmt.Sprintf("the record has token %d", o.FencingToken)
			case (a.State == stSucceeded || a.State == stFailed) && o.Attempt != a.Attempt:
				why = fmt.Sprintf("the record is at attempt %d, claimed again", o.Attempt)
			case (a.State == stSucceeded || a.State == stFailed) && int(o.State) != a.State && !supersededBySuccess(a, o):
				why = fmt.Sprintf("the record is %v", o.State)
			case (a.State == stPending || a.State == stUnknown) && o.Attempt == a.Attempt && o.State == client.StateRunning:
				why = "the record is RUNNING again"
			default:
				continue
			}
			lost++
			report(fmt.Sprintf("%s: acknowledged %s (%s, attempt %d, token %d) lost: %s",
				id, kindNames[a.Kind], stateNames[a.State], a.Attempt, a.Token, why))
		}
	}
	return lost, checked
}

// supersededBySuccess reports whether o shows the one legal way out of an
// acknowledged terminal state a: contract.md §4 accepts Complete with the latest
// attempt's token after the ledger concluded the operation failed
// (RETRIES_EXHAUSTED: out of attempts) or a reconciler abandoned it
// (ABANDONED), and complete.lua then turns that FAILED_FINAL into SUCCEEDED:
// the record must not keep the conclusion that the effect never happened.
// Nothing else leaves a terminal state, and no claim follows one, so:
//   - the acknowledged state is FAILED_FINAL with one of those two reasons;
//   - the acknowledgement is not the attempt's own FAILED_FINAL report
//     (that report binds its token: a success with it is
//     COMPLETION_CONFLICT);
//   - the record is SUCCEEDED at the acknowledged attempt (and token, which
//     lostAcks checks first), and its history has that late report: the
//     transition FAILED_FINAL → SUCCEEDED at that attempt, right after the
//     FAILED_FINAL with that reason.
func supersededBySuccess(a ack, o *client.Operation) bool {
	if a.State != stFailed || a.Reason != "RETRIES_EXHAUSTED" && a.Reason != "ABANDONED" ||
		a.Kind == kComplete && a.Outcome == outFinal ||
		o.State != client.StateSucceeded || o.Attempt != a.Attempt {
		return false
	}
	for i := 1; i < len(o.History); i++ {
		h, prev := o.History[i], o.History[i-1]
		if h.From == client.StateFailedFinal && h.To == client.StateSucceeded && h.Attempt == a.Attempt &&
			prev.To == client.StateFailedFinal && prev.Reason == a.Reason {
			return true
		}
	}
	return false
}

// TestRedisKill (issue 6 (a)) kills redis-server with SIGKILL three times
// while clients run operations through the ledger, restarting it each time
// from its append-only file (appendonly yes, appendfsync always). After each
// restart every acknowledged Reserve (EXECUTE), Complete, MarkUnknown and
// Reconcile must be in the store; operations that crashed agents left
// RUNNING or UNKNOWN are still there and resolve (S7); at the end every
// operation has settled, none ran twice, and the history, faults included,
// is linearizable.
//
// With LEDGER_TEST_FAULTS=long it also measures appendfsync everysec and no
// persistence at all, reporting what they lose instead of failing.
func TestRedisKill(t *testing.T) {
	t.Run("appendfsync=always", func(t *testing.T) {
		redisKill(t, scale(3, 4), []string{"--appendonly", "yes", "--appendfsync", "always"}, false)
	})
	if !long() {
		return
	}
	t.Run("appendfsync=everysec", func(t *testing.T) {
		redisKill(t, 3, []string{"--appendonly", "yes", "--appendfsync", "everysec"}, true)
	})
	t.Run("no persistence", func(t *testing.T) {
		redisKill(t, 1, nil, true)
	})
}

func redisKill(t *testing.T, kills int, args []string, measure bool) {
	srv := redistest.Start(t, args...)
	// As ledgerd sets up its client (cmd/ledgerd, openStore):
	// autopipelining on, so that batches meet the dead server too.
	rdb := redis.NewClient(redisOptions(srv.Addr))
	pipe := withAutopipe(t, rdb)
	st := startStack(t, rdb, policyYAML(3*time.Second), ledger.Options{})

	rec := newRecorder(effIrreversible, maxAttempts)
	dest := newDestination(true, 1)
	clients := newClients(t, 3, st.Addr, rec, dest)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// S7: operations left RUNNING or UNKNOWN by crashed agents must survive
	// the restarts and resolve afterwards.
	var crashed map[string]string
	if !measure {
		crashed = crashAgents(ctx, t, clients, dest, "crash", 6)
	}
	l := newLoad(dest, clients, 6)
	finish := l.background(ctx, t, "rk")

	report := func(s string) { t.Error(s) }
	if measure {
		report = func(s string) { t.Log(s) }
	}
	// Down for less than go-redis's patience (its dial retries and command
	// retries hide it: calls only slow down), and for longer (calls fail,
	// clients retry, reports are lost and reconciled).
	downs := []time.Duration{300 * time.Millisecond, 2500 * time.Millisecond, 800 * time.Millisecond}
	totalLost := 0
	for i := range kills {
		sleepCtx(ctx, 1200*time.Millisecond)
		srv.Stop() // SIGKILL
		killedAt := l.done.Load()
		down := downs[i%len(downs)]
		sleepCtx(ctx, down)
		srv.Restart(t)
		lost, checked := lostAcks(ctx, t, clients[0], rec.acknowledged(), report)
		totalLost += lost
		t.Logf("kill %d of redis-server after %d operations settled, down %v, restarted from its files: acknowledged writes checked %v, lost %d",
			i+1, killedAt, down, checked, lost)
	}
	for id, how := range crashed {
		o := waitState(ctx, t, clients[0], id, client.StateUnknown)
		t.Logf("crashed agent %s (%s): %s after the restarts", id, how, reasons(o))
	}
	resolveCrashed(ctx, t, clients[0], dest, crashed)
	sleepCtx(ctx, time.Second)
	opIDs := finish()

	var v verdict
	if measure {
		v = l.check(context.Background(), t, clients[0], opIDs, t.Logf)
	} else {
		v = l.verify(context.Background(), t, clients[0], opIDs)
	}
	calls, unknown := rec.counts()
	t.Logf("%d operations: %s; %s", len(opIDs), v, dest)
	t.Logf("ledger calls by the clients: %v, %d with an unknown outcome; Do errors retried: %s", calls, unknown, l.errors())
	batches, batched := pipe.Stats()
	t.Logf("autopipelining: %d scripts in %d batches", batched, batches)
	if measure {
		t.Logf("MEASURED %v: %d kills, %d acknowledged writes lost, %d duplicate effects, %d operations not settled",
			args, kills, totalLost, v.duplicates, v.unsettled)
		return
	}
	rec.linearizable(t, true)
}
