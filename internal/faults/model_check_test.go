package faults

import (
	"cmp"
	"testing"

	"github.com/anishathalye/porcupine"
)

// seq builds a sequential history of one operation: each call returns
// before the next starts, except those marked concurrent with the previous.
type seq struct {
	ops []porcupine.Operation
	t   int64
}

func (s *seq) add(in input, out output) *seq {
	in.ID = "op"
	if in.Kind == kReserve {
		in.Effect, in.Max = cmp.Or(in.Effect, effIrreversible), 3
	}
	s.t += 10
	s.ops = append(s.ops, porcupine.Operation{Input: in, Call: s.t, Output: out, Return: s.t + 5})
	return s
}

// unknown adds a call whose outcome was not learned (it returns at the end).
func (s *seq) unknown(in input) *seq {
	in.ID = "op"
	if in.Kind == kReserve {
		in.Effect, in.Max = effIrreversible, 3
	}
	s.t += 10
	s.ops = append(s.ops, porcupine.Operation{Input: in, Call: s.t, Output: output{Unknown: true}, Return: 1 << 40})
	return s
}

func running(dec int, att uint32, tok uint64) output {
	return output{Decision: dec, HasOp: true, State: stRunning, Attempt: att, Token: tok}
}

func rec(st int, att uint32, tok uint64, rid string) output {
	return output{HasOp: true, State: st, Attempt: att, Token: tok, RID: rid}
}

func reserve(h string) input     { return input{Kind: kReserve, Holder: h} }
func reserveIdem(h string) input { return input{Kind: kReserve, Holder: h, Effect: effIdempotent} }
func completeOK(tok uint64, rid string) input {
	return input{Kind: kComplete, Token: tok, Outcome: outSucceeded, RID: rid, Digest: "1|" + rid}
}
func markUnknownIn(tok uint64) input { return input{Kind: kMarkUnknown, Token: tok} }
func reconcileIn(f int, rid string) input {
	return input{Kind: kReconcile, Finding: f, RID: rid}
}
func fencedReconcileIn(f int, tok uint64) input {
	return input{Kind: kReconcile, Finding: f, Token: tok}
}
func findingBy(f int, tok uint64, principal, note string) input {
	return input{Kind: kReconcile, Finding: f, Token: tok, Principal: principal, Note: note}
}
func lookup() input { return input{Kind: kLookup} }

// TestModel checks the model on small histories: the legal ones the ledger
// produces pass, and the violations the suite exists to catch (a second
// EXECUTE, a lost acknowledged write, a reused token) are found. It keeps
// the linearizability checks of the fault tests from passing vacuously.
func TestModel(t *testing.T) {
	m := model()
	cases := []struct {
		name  string
		h     *seq
		legal bool
	}{
		{"execute, in progress, complete, replay", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(reserve("h2"), running(decInProgress, 1, 100)).
			add(completeOK(100, "r1"), rec(stSucceeded, 1, 100, "r1")).
			add(reserve("h3"), output{Decision: decReplay, HasOp: true, State: stSucceeded, Attempt: 1, Token: 100, RID: "r1"}), true},
		{"lost Reserve answer recovered by the same holder", new(seq).
			unknown(reserve("h1")).
			add(reserve("h1"), running(decExecute, 1, 100)), true},
		{"lease ended (sweeper), reconciled not applied, claimed again with a larger token", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(lookup(), rec(stUnknown, 1, 100, "")).
			add(reserve("h2"), output{Decision: decReconcile, HasOp: true, State: stUnknown, Attempt: 1, Token: 100}).
			add(reconcileIn(findNotApplied, ""), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 250)).
			add(completeOK(100, "r0"), output{Err: "STALE_FENCING_TOKEN"}).
			add(completeOK(250, "r2"), rec(stSucceeded, 2, 250, "r2")), true},
		{"ambiguous attempt marked unknown, reconciled applied, late Complete agrees", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(reconcileIn(findApplied, "r1"), rec(stSucceeded, 1, 100, "r1")).
			add(completeOK(100, "r1"), rec(stSucceeded, 1, 100, "r1")), true},
		{"a Reserve that may never have arrived: another holder creates the record", new(seq).
			unknown(reserve("h1")).
			add(reserve("h2"), running(decExecute, 1, 100)).
			add(reserve("h1"), running(decInProgress, 1, 100)), true},
		{"a Complete with an unknown outcome took effect", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			unknown(completeOK(100, "r1")).
			add(lookup(), rec(stSucceeded, 1, 100, "r1")), true},
		{"repeats after the record moved on are recognised: reconcile, mark unknown, retryable failure", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(fencedReconcileIn(findNotApplied, 100), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(fencedReconcileIn(findNotApplied, 100), rec(stRunning, 2, 200, "")).
			add(markUnknownIn(100), rec(stRunning, 2, 200, "")).
			add(input{Kind: kComplete, Token: 200, Outcome: outRetryable, Digest: "3|"}, rec(stPending, 2, 200, "")).
			add(reserve("h3"), running(decExecute, 3, 300)).
			add(input{Kind: kComplete, Token: 200, Outcome: outRetryable, Digest: "3|"}, rec(stRunning, 3, 300, "")), true},
		{"a not-applied finding repeated after the record went terminal: OK; unfenced or new: ALREADY_RESOLVED", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(fencedReconcileIn(findNotApplied, 100), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(completeOK(200, "r2"), rec(stSucceeded, 2, 200, "r2")).
			add(fencedReconcileIn(findNotApplied, 100), rec(stSucceeded, 2, 200, "r2")).
			add(reconcileIn(findNotApplied, ""), output{Err: "ALREADY_RESOLVED"}).
			add(findingBy(findNotApplied, 100, "rec", "looked again"), output{Err: "ALREADY_RESOLVED"}).
			add(fencedReconcileIn(findNotApplied, 200), output{Err: "ALREADY_RESOLVED"}).
			add(fencedReconcileIn(findEscalate, 100), output{Err: "ALREADY_RESOLVED"}), true},
		{"a new not-applied finding on a terminal record answered OK", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(completeOK(100, "r1"), rec(stSucceeded, 1, 100, "r1")).
			add(fencedReconcileIn(findNotApplied, 100), rec(stSucceeded, 1, 100, "r1")), false},
		{"mark unknown repeated after a finding, before the next claim: the finding stands", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(fencedReconcileIn(findNotApplied, 100), rec(stPending, 1, 100, "")).
			add(markUnknownIn(100), rec(stPending, 1, 100, "")), true},
		{"mark unknown after the lease ended (sweeper), repeated after a finding: the finding stands", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(lookup(), rec(stUnknown, 1, 100, "")).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(fencedReconcileIn(findNotApplied, 100), rec(stPending, 1, 100, "")).
			add(markUnknownIn(100), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)), true},
		{"a fenced finding about an earlier attempt is refused", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(fencedReconcileIn(findNotApplied, 100), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(fencedReconcileIn(findAbandon, 100), output{Err: "STALE_FENCING_TOKEN"}).
			add(lookup(), rec(stRunning, 2, 200, "")), true},
		{"another note about an earlier attempt is refused, not taken for a repeat", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 100, "rec", "no refund at the bank"), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(findingBy(findNotApplied, 100, "rec", "no refund on second look"), output{Err: "STALE_FENCING_TOKEN"}).
			add(lookup(), rec(stRunning, 2, 200, "")), true},
		{"another principal's finding about an earlier attempt is refused", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 100, "rec", "no refund at the bank"), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(findingBy(findNotApplied, 100, "rec-2", "no refund at the bank"), output{Err: "STALE_FENCING_TOKEN"}), true},
		{"another note's escalation about an earlier attempt is refused", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(findingBy(findEscalate, 100, "rec", "the bank does not answer"), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 100, "rec", "no refund at the bank"), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(findingBy(findEscalate, 100, "rec", "still no answer"), output{Err: "STALE_FENCING_TOKEN"}), true},
		{"a finding repeated after its attempt's worker reported unknown: the report stands", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(lookup(), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 100, "rec", "no refund at the bank"), rec(stPending, 1, 100, "")).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 100, "rec", "no refund at the bank"), rec(stUnknown, 1, 100, "")), true},
		{"an unfenced finding repeated after the next claim is refused", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 0, "rec", "no refund at the bank"), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(findingBy(findNotApplied, 0, "rec", "no refund at the bank"), output{Err: "STALE_FENCING_TOKEN"}).
			add(markUnknownIn(200), rec(stUnknown, 2, 200, "")).
			add(findingBy(findNotApplied, 0, "rec", "no refund at the bank"), output{Err: "STALE_FENCING_TOKEN"}).
			add(findingBy(findNotApplied, 200, "rec", "no refund at the bank"), rec(stPending, 2, 200, "")), true},

		{"a second EXECUTE while the first claim is live", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(reserve("h2"), running(decExecute, 2, 200)), false},
		{"a second EXECUTE of an irreversible operation without reconciliation", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(reserve("h2"), output{Decision: decReconcile, HasOp: true, State: stUnknown, Attempt: 1, Token: 100}).
			add(reserve("h2"), running(decExecute, 2, 200)), false},
		{"an acknowledged Complete lost", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(completeOK(100, "r1"), rec(stSucceeded, 1, 100, "r1")).
			add(lookup(), rec(stRunning, 1, 100, "")), false},
		{"an acknowledged claim lost", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(lookup(), output{Err: "NOT_FOUND"}), false},
		{"a token reused by a new claim", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(reconcileIn(findNotApplied, ""), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 100)), false},
		{"a replay of another result", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(completeOK(100, "r1"), rec(stSucceeded, 1, 100, "r1")).
			add(reserve("h2"), output{Decision: decReplay, HasOp: true, State: stSucceeded, Attempt: 1, Token: 100, RID: "r2"}), false},
		{"a repeated finding about attempt 1 resolves attempt 2", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(fencedReconcileIn(findNotApplied, 100), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(markUnknownIn(200), rec(stUnknown, 2, 200, "")).
			add(fencedReconcileIn(findNotApplied, 100), rec(stPending, 2, 200, "")), false},
		{"a repeat that was never recorded answered OK", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(fencedReconcileIn(findNotApplied, 100), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(input{Kind: kComplete, Token: 100, Outcome: outRetryable, Digest: "3|"}, rec(stRunning, 2, 200, "")), false},
		{"a stale token accepted", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(reconcileIn(findNotApplied, ""), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(completeOK(100, "r1"), rec(stSucceeded, 2, 200, "r1")), false},
		{"another note about an earlier attempt answered as a repeat", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 100, "rec", "no refund at the bank"), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(findingBy(findNotApplied, 100, "rec", "no refund on second look"), rec(stRunning, 2, 200, "")), false},
		{"a repeated unfenced finding resolves the next attempt", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 0, "rec", "no refund at the bank"), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(markUnknownIn(200), rec(stUnknown, 2, 200, "")).
			add(findingBy(findNotApplied, 0, "rec", "no refund at the bank"), rec(stPending, 2, 200, "")), false},
		{"an unfenced finding about an earlier attempt answered OK, recording nothing", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 0, "rec", "no refund at the bank"), rec(stPending, 1, 100, "")).
			add(reserve("h2"), running(decExecute, 2, 200)).
			add(markUnknownIn(200), rec(stUnknown, 2, 200, "")).
			add(findingBy(findNotApplied, 0, "rec", "no refund at the bank"), rec(stUnknown, 2, 200, "")), false},
		{"an escalated idempotent operation reclaimed", new(seq).
			add(reserveIdem("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(findingBy(findEscalate, 100, "rec", "a human looks"), rec(stUnknown, 1, 100, "")).
			add(reserveIdem("h2"), running(decExecute, 2, 200)), false},
		{"a repeated finding undoes its attempt's later unknown report", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(lookup(), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 100, "rec", "no refund at the bank"), rec(stPending, 1, 100, "")).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(findingBy(findNotApplied, 100, "rec", "no refund at the bank"), rec(stPending, 1, 100, "")), false},

		// On a terminal record the same finding is the same kind with the
		// outcome that stands; the same kind with another one is
		// ALREADY_RESOLVED and changes nothing.
		{"applied on SUCCEEDED: OK with the result that stands, ALREADY_RESOLVED with another", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(completeOK(100, "r1"), rec(stSucceeded, 1, 100, "r1")).
			add(reconcileIn(findApplied, "r2"), output{Err: "ALREADY_RESOLVED"}).
			add(reconcileIn(findApplied, ""), output{Err: "ALREADY_RESOLVED"}).
			add(reconcileIn(findApplied, "r1"), rec(stSucceeded, 1, 100, "r1")).
			add(lookup(), rec(stSucceeded, 1, 100, "r1")), true},
		{"applied on SUCCEEDED answered OK with another result than the one that stands", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(completeOK(100, "r1"), rec(stSucceeded, 1, 100, "r1")).
			add(reconcileIn(findApplied, "r2"), rec(stSucceeded, 1, 100, "r1")), false},
		{"applied on SUCCEEDED by an earlier finding: the data counts too", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(input{Kind: kReconcile, Finding: findApplied, RID: "r1", Data: `{"amount":1}`}, rec(stSucceeded, 1, 100, "r1")).
			add(input{Kind: kReconcile, Finding: findApplied, RID: "r1", Data: `{"amount":1}`, Note: "again"}, rec(stSucceeded, 1, 100, "r1")).
			add(input{Kind: kReconcile, Finding: findApplied, RID: "r1", Data: `{"amount":2}`}, output{Err: "ALREADY_RESOLVED"}).
			add(reconcileIn(findApplied, "r1"), output{Err: "ALREADY_RESOLVED"}), true},
		{"applied on SUCCEEDED: an empty object is the same data as none", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(input{Kind: kComplete, Token: 100, Outcome: outSucceeded, RID: "r1", Data: `{}`, Digest: "1|r1|{}"}, rec(stSucceeded, 1, 100, "r1")).
			add(reconcileIn(findApplied, "r1"), rec(stSucceeded, 1, 100, "r1")).
			add(input{Kind: kReconcile, Finding: findApplied, RID: "r1", Data: `{}`}, rec(stSucceeded, 1, 100, "r1")).
			add(input{Kind: kReconcile, Finding: findApplied, RID: "r1", Data: `{"amount":2}`}, output{Err: "ALREADY_RESOLVED"}), true},
		{"applied answered OK with other data than the data that stands", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(input{Kind: kComplete, Token: 100, Outcome: outSucceeded, RID: "r1", Data: `{"amount":1}`, Digest: "1|r1|1"}, rec(stSucceeded, 1, 100, "r1")).
			add(input{Kind: kReconcile, Finding: findApplied, RID: "r1", Data: `{"amount":2}`}, rec(stSucceeded, 1, 100, "r1")), false},
		{"abandon on FAILED_FINAL: OK with the failure that stands, ALREADY_RESOLVED with another", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(input{Kind: kReconcile, Finding: findAbandon, Code: "GONE", Msg: "no order"}, rec(stFailed, 1, 100, "")).
			add(input{Kind: kReconcile, Finding: findAbandon, Code: "GONE", Msg: "no order"}, rec(stFailed, 1, 100, "")).
			add(input{Kind: kReconcile, Finding: findAbandon, Code: "OTHER", Msg: "no order"}, output{Err: "ALREADY_RESOLVED"}).
			add(input{Kind: kReconcile, Finding: findAbandon, Code: "GONE", Msg: "cancelled"}, output{Err: "ALREADY_RESOLVED"}).
			add(reconcileIn(findAbandon, ""), output{Err: "ALREADY_RESOLVED"}), true},
		{"abandon without a failure matches ABANDONED", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(markUnknownIn(100), rec(stUnknown, 1, 100, "")).
			add(reconcileIn(findAbandon, ""), rec(stFailed, 1, 100, "")).
			add(input{Kind: kReconcile, Finding: findAbandon, Code: "ABANDONED"}, rec(stFailed, 1, 100, "")).
			add(input{Kind: kReconcile, Finding: findAbandon, Code: "GONE"}, output{Err: "ALREADY_RESOLVED"}), true},
		{"abandon on a worker's FAILED_FINAL answered OK with another failure", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(input{Kind: kComplete, Token: 100, Outcome: outFinal, Code: "declined", Digest: "2|declined"}, rec(stFailed, 1, 100, "")).
			add(reconcileIn(findAbandon, ""), rec(stFailed, 1, 100, "")), false},
		{"abandon on RETRIES_EXHAUSTED: OK only with that failure", new(seq).
			add(reserve("h1"), running(decExecute, 1, 100)).
			add(input{Kind: kComplete, Token: 100, Outcome: outRetryable, Code: "503", Digest: "3|503"}, rec(stPending, 1, 100, "")).
			add(reserve("h1"), running(decExecute, 2, 200)).
			add(input{Kind: kComplete, Token: 200, Outcome: outRetryable, Code: "503", Digest: "3|503"}, rec(stPending, 2, 200, "")).
			add(reserve("h1"), running(decExecute, 3, 300)).
			add(input{Kind: kComplete, Token: 300, Outcome: outRetryable, Code: "503", Digest: "3|503"}, rec(stPending, 3, 300, "")).
			add(reserve("h1"), output{Decision: decReplay, HasOp: true, State: stFailed, Attempt: 3, Token: 300}).
			add(reconcileIn(findAbandon, ""), output{Err: "ALREADY_RESOLVED"}).
			add(input{Kind: kReconcile, Finding: findAbandon, Code: "RETRIES_EXHAUSTED", Msg: "the policy allows 3 attempts"}, rec(stFailed, 3, 300, "")), true},
	}
	for _, c := range cases {
		if got := porcupine.CheckOperations(m, c.h.ops); got != c.legal {
			t.Errorf("%s: linearizable = %v, want %v\n%s", c.name, got, c.legal, describeAll(c.h.ops))
		}
	}
}
