package ledger

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/fingerprint"
)

func TestReserveCreatesRunningClaim(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		res := e.reserve(t, "op-1", "payments.refund", map[string]any{"amount": 10.0}, "h1")
		if res.Decision != DecisionExecute {
			t.Fatalf("decision = %v, want EXECUTE", res.Decision)
		}
		o := res.Operation
		if o.State != StateRunning || o.Attempt != 1 || o.FencingToken == 0 || o.Effect != EffectIrreversible {
			t.Fatalf("snapshot = %+v", o)
		}
		if !o.LeaseExpiresAt.After(o.CreatedAt) || o.MaxAttempts != 3 {
			t.Fatalf("lease %v created %v max %d", o.LeaseExpiresAt, o.CreatedAt, o.MaxAttempts)
		}
		k := e.opKeys("op-1")
		if n, _ := e.rdb.ZCard(e.ctx, k.all[1]).Result(); n != 1 {
			t.Fatalf("unresolved index holds %d, want 1", n)
		}
		if s, err := e.rdb.ZScore(e.ctx, k.all[2], k.member).Result(); err != nil || int64(s) != o.LeaseExpiresAt.UnixMilli() {
			t.Fatalf("lease index score %v (%v), want %d", s, err, o.LeaseExpiresAt.UnixMilli())
		}
		if ttl, _ := e.rdb.PTTL(e.ctx, k.all[0]).Result(); ttl != -1 {
			t.Fatalf("non-terminal record has TTL %v; it must never expire", ttl)
		}
		got := e.lookup(t, "op-1")
		if !slices.Equal(reasons(got), []string{"RESERVED"}) || got.History[0].From != StateUnspecified || got.History[0].To != StateRunning {
			t.Fatalf("history = %+v", got.History)
		}
		if got.History[0].Principal != "agent-1" {
			t.Fatalf("principal = %q", got.History[0].Principal)
		}
	})
}

func TestReserveSameHolderRecoversClaim(t *testing.T) { // S10 at the script level
	eachBackend(t, func(t *testing.T, e *env) {
		first := e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0}, "h1")
		again := e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0}, "h1")
		if again.Decision != DecisionExecute || again.Operation.Attempt != 1 || again.Operation.FencingToken != first.Operation.FencingToken {
			t.Fatalf("again = %v %+v, want EXECUTE with the same attempt and token", again.Decision, again.Operation)
		}
		other := e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0}, "h2")
		if other.Decision != DecisionInProgress || other.RetryAfter < minRetryAfter || other.RetryAfter > maxRetryAfter {
			t.Fatalf("other holder = %v retry_after %v, want IN_PROGRESS", other.Decision, other.RetryAfter)
		}
		if n := len(e.lookup(t, "op").History); n != 1 {
			t.Fatalf("history has %d entries, want 1", n)
		}
	})
}

func TestReserveConflictLeavesRecordUntouched(t *testing.T) { // S4
	eachBackend(t, func(t *testing.T, e *env) {
		e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0, "memo": "a"}, "h1")
		before, err := e.rdb.Get(e.ctx, e.opKeys("op").all[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			req  ReserveRequest
			want []string
		}{
			{ReserveRequest{Tool: "payments.refund", Params: map[string]any{"amount": 11.0, "memo": "a"}, PermitID: "permit-1"}, []string{"params"}},
			{ReserveRequest{Tool: "payments.refund", Params: map[string]any{"amount": 10.0, "memo": "b"}, PermitID: "permit-1"}, []string{"params"}},
			{ReserveRequest{Tool: "payments.charge", Params: map[string]any{"amount": 10.0, "memo": "a"}, PermitID: "permit-1"}, []string{"tool"}},
			{ReserveRequest{Tool: "payments.refund", Params: map[string]any{"amount": 10.0, "memo": "a"}, PermitID: "permit-2"}, []string{"permit"}},
			{ReserveRequest{Tool: "x.y", Params: map[string]any{}, PermitID: ""}, []string{"tool", "params", "permit"}},
		}
		for _, c := range cases {
			c.req.OperationID, c.req.Holder = "op", "h1"
			_, err := e.l.Reserve(e.ctx, e.who, c.req)
			if ke := wantKind(t, err, KindKeyReused); !slices.Equal(ke.Differs, c.want) {
				t.Errorf("differs = %v, want %v", ke.Differs, c.want)
			}
		}
		if after, _ := e.rdb.Get(e.ctx, e.opKeys("op").all[0]).Result(); after != before {
			t.Fatalf("record changed: %q, then %q", before, after)
		}
	})
}

func TestReserveParamsSHA256EqualsParams(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		params := map[string]any{"amount": 10.5, "currency": "EUR", "memo": "ignored"}
		e.reserve(t, "op", "fields.refund", params, "h1")
		fp, err := fingerprint.Compute(params, []string{"/amount", "/currency"})
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "fields.refund", ParamsSHA256: fp[:], PermitID: "permit-1", Holder: "h1"})
		if err != nil || res.Decision != DecisionExecute {
			t.Fatalf("Reserve with params_sha256 = %v, %v; want the same claim", res, err)
		}
		// Only the consequential fields count: a changed memo is the same request.
		res = e.reserve(t, "op", "fields.refund", map[string]any{"amount": 10.5, "currency": "EUR", "memo": "other"}, "h1")
		if res.Decision != DecisionExecute {
			t.Fatalf("decision = %v", res.Decision)
		}
		_, err = e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "fields.refund", Params: map[string]any{"amount": 10.5, "currency": "USD"}, PermitID: "permit-1", Holder: "h1"})
		wantKind(t, err, KindKeyReused)
	})
}

func TestCompleteSucceeded(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "payments.refund")
		r := &Result{Data: []byte(`{"refund_id":"r-1"}`), ResourceID: "r-1"}
		done, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if done.State != StateSucceeded || string(done.Result.Data) != `{"refund_id":"r-1"}` || done.Result.ResourceID != "r-1" {
			t.Fatalf("completed = %+v", done)
		}
		k := e.opKeys("op")
		if n, _ := e.rdb.ZCard(e.ctx, k.all[1]).Result(); n != 0 {
			t.Fatalf("terminal operation still in the unresolved index")
		}
		if inLeaseIndex(e, "op") {
			t.Fatalf("terminal operation still in the lease index")
		}
		// One key holds the record, its history and, after the retention,
		// its tombstone: it lives until the end of the tombstone retention.
		ttl, _ := e.rdb.PTTL(e.ctx, k.all[0]).Result()
		if want := time.Until(done.ExpiresAt) + DefaultPolicy.TombstoneRetention; ttl <= 0 || ttl > want+time.Second || ttl < want-time.Minute {
			t.Fatalf("record TTL %v after the terminal transition, want about %v", ttl, want)
		}
		stored, _ := e.rdb.Get(e.ctx, k.all[0]).Result()
		if tomb, _, err := decodeRecord(stored); err != nil || tomb.State != StateSucceeded || tomb.Fingerprint != o.Fingerprint {
			t.Fatalf("stored record = %+v, %v; want the final state and the fingerprint", tomb, err)
		}
		// A repeat succeeds again, without a second history entry.
		again, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, r, nil)
		if err != nil || again.State != StateSucceeded {
			t.Fatalf("repeat = %v, %v", again, err)
		}
		if got := reasons(e.lookup(t, "op")); !slices.Equal(got, []string{"RESERVED", "SUCCEEDED"}) {
			t.Fatalf("history = %v", got)
		}
		// Another outcome under the same token is a conflict.
		_, err = e.complete(t, "op", o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r-2"}, nil)
		wantKind(t, err, KindCompletionConflict)
		_, err = e.complete(t, "op", o.FencingToken, OutcomeFailedFinal, nil, &Failure{Code: "x"})
		wantKind(t, err, KindCompletionConflict)
		// And Reserve replays the result.
		res := e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0}, "h-other")
		if res.Decision != DecisionReplay || res.Operation.Result.ResourceID != "r-1" {
			t.Fatalf("Reserve after success = %v %+v", res.Decision, res.Operation.Result)
		}
	})
}

func TestCompleteFailedFinalReplaysFailure(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "payments.refund")
		if _, err := e.complete(t, "op", o.FencingToken, OutcomeFailedFinal, nil, &Failure{Code: "card_declined", Message: "declined"}); err != nil {
			t.Fatal(err)
		}
		res := e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0}, "h2")
		if res.Decision != DecisionReplay || res.Operation.State != StateFailedFinal || res.Operation.Failure.Code != "card_declined" {
			t.Fatalf("Reserve after final failure = %v %+v", res.Decision, res.Operation)
		}
	})
}

func TestCompleteRetryableThenClaimAgain(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "payments.refund")
		p, err := e.complete(t, "op", o.FencingToken, OutcomeFailedRetryable, nil, &Failure{Code: "429"})
		if err != nil || p.State != StatePending || p.Failure.Code != "429" {
			t.Fatalf("retryable = %+v, %v", p, err)
		}
		if _, err := e.complete(t, "op", o.FencingToken, OutcomeFailedRetryable, nil, &Failure{Code: "429"}); err != nil {
			t.Fatalf("repeat of the retryable report: %v", err)
		}
		// The attempt already reported: it cannot also be unknown.
		_, err = e.markUnknown(t, "op", o.FencingToken)
		wantKind(t, err, KindCompletionConflict)
		res := e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0}, "h2")
		if res.Decision != DecisionExecute || res.Operation.Attempt != 2 || res.Operation.FencingToken <= o.FencingToken || res.Operation.Failure != nil {
			t.Fatalf("claim after retryable = %v %+v", res.Decision, res.Operation)
		}
		if got := reasons(e.lookup(t, "op")); !slices.Equal(got, []string{"RESERVED", "FAILED_RETRYABLE", "CLAIMED"}) {
			t.Fatalf("history = %v", got)
		}
	})
}

func TestRetriesExhausted(t *testing.T) { // S13 at the script level
	eachBackend(t, func(t *testing.T, e *env) {
		for attempt := uint32(1); attempt <= 3; attempt++ {
			res := e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0}, "h")
			if res.Decision != DecisionExecute || res.Operation.Attempt != attempt {
				t.Fatalf("attempt %d: %v %+v", attempt, res.Decision, res.Operation)
			}
			if _, err := e.complete(t, "op", res.Operation.FencingToken, OutcomeFailedRetryable, nil, &Failure{Code: "503"}); err != nil {
				t.Fatal(err)
			}
		}
		res := e.reserve(t, "op", "payments.refund", map[string]any{"amount": 10.0}, "h")
		if res.Decision != DecisionReplay || res.Operation.State != StateFailedFinal || res.Operation.Reason != "RETRIES_EXHAUSTED" || res.Operation.Failure.Code != "RETRIES_EXHAUSTED" {
			t.Fatalf("after 3 attempts = %v %+v", res.Decision, res.Operation)
		}
	})
}

func TestStaleTokenRefused(t *testing.T) { // S11 at the script level
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "idempotent.sync")
		if _, err := e.complete(t, "op", o.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
			t.Fatal(err)
		}
		second := e.reserve(t, "op", "idempotent.sync", map[string]any{"amount": 10.0}, "h2").Operation
		good := &Result{ResourceID: "second"}
		if _, err := e.complete(t, "op", second.FencingToken, OutcomeSucceeded, good, nil); err != nil {
			t.Fatal(err)
		}
		for _, call := range []func() error{
			func() error {
				_, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "first"}, nil)
				return err
			},
			func() error { _, err := e.markUnknown(t, "op", o.FencingToken); return err },
			func() error {
				_, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "op", FencingToken: o.FencingToken})
				return err
			},
		} {
			if se := wantKind(t, call(), KindStaleToken); se.State != StateSucceeded {
				t.Errorf("stale error state = %v", se.State)
			}
		}
		if got := e.lookup(t, "op"); got.Result.ResourceID != "second" {
			t.Fatalf("a stale worker overwrote the result: %+v", got.Result)
		}
	})
}

func TestLeaseExpiryIrreversibleNeedsReconcile(t *testing.T) { // S3 at the script level
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "expiring.refund")
		waitLeaseExpiry()
		res := e.reserve(t, "op", "expiring.refund", map[string]any{"amount": 10.0}, "h2")
		if res.Decision != DecisionReconcile || res.Operation.State != StateUnknown || res.Operation.Reason != "LEASE_EXPIRED" {
			t.Fatalf("after lease expiry = %v %+v", res.Decision, res.Operation)
		}
		if res.Operation.RecoveryDeadline.Sub(res.Operation.UnknownSince) != DefaultPolicy.RecoveryWindow {
			t.Fatalf("recovery deadline %v since %v", res.Operation.RecoveryDeadline, res.Operation.UnknownSince)
		}
		res = e.reserve(t, "op", "expiring.refund", map[string]any{"amount": 10.0}, "h3")
		if res.Decision != DecisionReconcile {
			t.Fatalf("UNKNOWN irreversible = %v, want RECONCILE", res.Decision)
		}
		// The late but authoritative report of the original worker wins.
		done, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "late"}, nil)
		if err != nil || done.State != StateSucceeded {
			t.Fatalf("late Complete from UNKNOWN = %+v, %v", done, err)
		}
		if got := reasons(e.lookup(t, "op")); !slices.Equal(got, []string{"RESERVED", "LEASE_EXPIRED", "SUCCEEDED"}) {
			t.Fatalf("history = %v", got)
		}
	})
}

func TestLeaseExpiryIdempotentReclaims(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "expiring.idempotent")
		waitLeaseExpiry()
		res := e.reserve(t, "op", "expiring.idempotent", map[string]any{"amount": 10.0}, "h2")
		if res.Decision != DecisionExecute || res.Operation.Attempt != 2 || res.Operation.FencingToken <= o.FencingToken {
			t.Fatalf("reclaim = %v %+v", res.Decision, res.Operation)
		}
		waitLeaseExpiry()
		e.reserve(t, "op", "expiring.idempotent", map[string]any{"amount": 10.0}, "h3")
		waitLeaseExpiry()
		// Out of attempts: not FAILED_FINAL (the effect may exist), but UNKNOWN.
		res = e.reserve(t, "op", "expiring.idempotent", map[string]any{"amount": 10.0}, "h4")
		if res.Decision != DecisionReconcile || res.Operation.State != StateUnknown || res.Operation.Reason != "RETRIES_EXHAUSTED" {
			t.Fatalf("exhausted reclaim = %v %+v", res.Decision, res.Operation)
		}
		if res := e.reserve(t, "op", "expiring.idempotent", map[string]any{"amount": 10.0}, "h5"); res.Decision != DecisionReconcile {
			t.Fatalf("exhausted UNKNOWN = %v", res.Decision)
		}
	})
}

func TestUnknownIdempotentReclaims(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "idempotent.sync")
		if _, err := e.markUnknown(t, "op", o.FencingToken); err != nil {
			t.Fatal(err)
		}
		res := e.reserve(t, "op", "idempotent.sync", map[string]any{"amount": 10.0}, "h2")
		if res.Decision != DecisionExecute || res.Operation.Attempt != 2 || !res.Operation.UnknownSince.IsZero() {
			t.Fatalf("UNKNOWN idempotent = %v %+v", res.Decision, res.Operation)
		}
	})
}

func TestMarkUnknown(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "payments.refund")
		u, err := e.markUnknown(t, "op", o.FencingToken)
		if err != nil || u.State != StateUnknown || u.UnknownSince.IsZero() || !u.LeaseExpiresAt.IsZero() {
			t.Fatalf("MarkUnknown = %+v, %v", u, err)
		}
		if _, err := e.markUnknown(t, "op", o.FencingToken); err != nil {
			t.Fatalf("repeat: %v", err)
		}
		got := e.lookup(t, "op")
		if !slices.Equal(reasons(got), []string{"RESERVED", "MARKED_UNKNOWN"}) || got.History[1].Detail != "timeout" {
			t.Fatalf("history = %+v", got.History)
		}
		if inLeaseIndex(e, "op") {
			t.Fatalf("UNKNOWN operation still in the lease index")
		}
		// Never downgrades a terminal state.
		if _, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil); err != nil {
			t.Fatal(err)
		}
		after, err := e.markUnknown(t, "op", o.FencingToken)
		if err != nil || after.State != StateSucceeded {
			t.Fatalf("MarkUnknown on SUCCEEDED = %+v, %v", after, err)
		}
	})
}

func TestRenew(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "payments.refund")
		time.Sleep(20 * time.Millisecond)
		r, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "op", FencingToken: o.FencingToken})
		if err != nil || !r.LeaseExpiresAt.After(o.LeaseExpiresAt) {
			t.Fatalf("Renew = %+v, %v", r, err)
		}
		k := e.opKeys("op")
		if s, _ := e.rdb.ZScore(e.ctx, k.all[2], k.member).Result(); int64(s) != r.LeaseExpiresAt.UnixMilli() {
			t.Fatalf("lease index not moved: %v", s)
		}
		_, err = e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "op", FencingToken: o.FencingToken + 1})
		wantKind(t, err, KindStaleToken)

		x := e.execute(t, "x", "expiring.refund")
		waitLeaseExpiry()
		_, err = e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "x", FencingToken: x.FencingToken})
		if se := wantKind(t, err, KindStaleToken); se.State != StateUnknown {
			t.Fatalf("Renew past the lease: state %v, want UNKNOWN", se.State)
		}
	})
}

func TestReconcile(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		unknown := func(id string) *Operation {
			o := e.execute(t, id, "payments.refund")
			if _, err := e.markUnknown(t, id, o.FencingToken); err != nil {
				t.Fatal(err)
			}
			return o
		}

		unknown("applied")
		r := &Result{Data: []byte(`{"found":true}`), ResourceID: "r-9"}
		done, err := e.reconcile(t, "applied", FindingApplied, r)
		if err != nil || done.State != StateSucceeded || done.Result.ResourceID != "r-9" || done.Reason != "RECONCILED_APPLIED" {
			t.Fatalf("applied = %+v, %v", done, err)
		}
		if _, err := e.reconcile(t, "applied", FindingApplied, r); err != nil {
			t.Fatalf("repeat applied: %v", err)
		}
		_, err = e.reconcile(t, "applied", FindingNotApplied, nil)
		wantKind(t, err, KindAlreadyResolved)
		if n := len(e.lookup(t, "applied").History); n != 3 {
			t.Fatalf("history has %d entries, want 3", n)
		}

		unknown("not-applied")
		p, err := e.reconcile(t, "not-applied", FindingNotApplied, nil)
		if err != nil || p.State != StatePending {
			t.Fatalf("not applied = %+v, %v", p, err)
		}
		if _, err := e.reconcile(t, "not-applied", FindingNotApplied, nil); err != nil {
			t.Fatalf("repeat not applied: %v", err)
		}
		if res := e.reserve(t, "not-applied", "payments.refund", map[string]any{"amount": 10.0}, "h"); res.Decision != DecisionExecute || res.Operation.Attempt != 2 {
			t.Fatalf("after not applied = %v %+v", res.Decision, res.Operation)
		}

		unknown("abandon")
		a, err := e.reconcile(t, "abandon", FindingAbandon, nil)
		if err != nil || a.State != StateFailedFinal || a.Failure.Code != "ABANDONED" {
			t.Fatalf("abandon = %+v, %v", a, err)
		}

		unknown("escalate")
		esc, err := e.reconcile(t, "escalate", FindingEscalate, nil)
		if err != nil || esc.State != StateUnknown || !esc.NeedsReview {
			t.Fatalf("escalate = %+v, %v", esc, err)
		}
		if _, err := e.reconcile(t, "escalate", FindingEscalate, nil); err != nil {
			t.Fatal(err)
		}
		if got := reasons(e.lookup(t, "escalate")); !slices.Equal(got, []string{"RESERVED", "MARKED_UNKNOWN", "ESCALATED"}) {
			t.Fatalf("history = %v", got)
		}
		done, err = e.reconcile(t, "escalate", FindingApplied, nil)
		if err != nil || done.State != StateSucceeded || done.NeedsReview {
			t.Fatalf("applied after escalation = %+v, %v", done, err)
		}

		live := e.execute(t, "live", "payments.refund")
		_, err = e.reconcile(t, "live", FindingApplied, nil)
		if ie := wantKind(t, err, KindInProgress); ie.RetryAfter <= 0 || ie.Operation.FencingToken != live.FencingToken {
			t.Fatalf("in progress error = %+v", ie)
		}

		_, err = e.reconcile(t, "never", FindingApplied, nil)
		wantKind(t, err, KindNotFound)
	})
}

func TestReconcileExpiredLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		e.execute(t, "op", "expiring.refund")
		waitLeaseExpiry()
		done, err := e.reconcile(t, "op", FindingApplied, &Result{ResourceID: "r"})
		if err != nil || done.State != StateSucceeded {
			t.Fatalf("Reconcile past the lease = %+v, %v", done, err)
		}
	})
}

func TestCompleteAfterNotAppliedFinding(t *testing.T) {
	// The sweeper made the claim UNKNOWN, a reconciler found nothing, then the
	// worker finishes: its report wins, so the next claim cannot repeat it.
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "expiring.refund")
		waitLeaseExpiry()
		e.sweep(t)
		if _, err := e.reconcile(t, "op", FindingNotApplied, nil); err != nil {
			t.Fatal(err)
		}
		done, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil)
		if err != nil || done.State != StateSucceeded {
			t.Fatalf("Complete from PENDING = %+v, %v", done, err)
		}
		if res := e.reserve(t, "op", "expiring.refund", map[string]any{"amount": 10.0}, "h2"); res.Decision != DecisionReplay {
			t.Fatalf("decision = %v, want REPLAY", res.Decision)
		}
	})
}

func TestSweeper(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		e.execute(t, "irrev", "expiring.refund")
		e.execute(t, "idem", "expiring.idempotent")
		e.execute(t, "live", "payments.refund")
		waitLeaseExpiry()
		// Other tests share the store: count only this tenant's operations.
		for range 2 {
			e.sweep(t)
		}
		irrev := e.lookup(t, "irrev")
		if irrev.State != StateUnknown || irrev.Reason != "LEASE_EXPIRED" || irrev.History[1].Principal != SweeperPrincipal {
			t.Fatalf("irreversible after sweep = %+v", irrev)
		}
		if len(irrev.History) != 2 {
			t.Fatalf("a second sweep added history: %v", reasons(irrev))
		}
		if idem := e.lookup(t, "idem"); idem.State != StateRunning {
			t.Fatalf("idempotent after sweep = %v, want RUNNING past its lease", idem.State)
		}
		if inLeaseIndex(e, "idem") {
			t.Fatalf("idempotent operation still in the lease index")
		}
		if live := e.lookup(t, "live"); live.State != StateRunning {
			t.Fatalf("live claim swept: %v", live.State)
		}
	})
}

func TestTombstone(t *testing.T) { // S6 at the script level
	eachBackend(t, func(t *testing.T, e *env) {
		o := e.execute(t, "op", "short.refund")
		if _, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil); err != nil {
			t.Fatal(err)
		}
		// The record is its own tombstone after its retention.
		stored, _ := e.rdb.Get(e.ctx, e.opKeys("op").all[0]).Result()
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := e.l.Lookup(e.ctx, e.who, "op")
			if err != nil {
				if ee := wantKind(t, err, KindKeyExpired); ee.State != StateSucceeded {
					t.Fatalf("expired state = %v", ee.State)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("record never expired")
			}
			time.Sleep(100 * time.Millisecond)
		}
		_, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "short.refund", Params: map[string]any{"amount": 10.0}, PermitID: "permit-1", Holder: "late"})
		wantKind(t, err, KindKeyExpired)
		if now, _ := e.rdb.Get(e.ctx, e.opKeys("op").all[0]).Result(); now != stored {
			t.Fatal("a late Reserve re-created the record")
		}
	})
}

func TestRetainUntilExtendsRetention(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		until := time.Now().Add(48 * time.Hour)
		res, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "short.book", PermitID: "p", Holder: "h", RetainUntil: until})
		if err != nil {
			t.Fatal(err)
		}
		done, err := e.complete(t, "op", res.Operation.FencingToken, OutcomeSucceeded, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		// short.* has retention 1s and no grace: retain_until decides.
		if d := done.ExpiresAt.Sub(until); d < -time.Second || d > time.Second {
			t.Fatalf("expires at %v, want about %v", done.ExpiresAt, until)
		}
		ttl, _ := e.rdb.PTTL(e.ctx, e.opKeys("op").all[0]).Result()
		if ttl < 47*time.Hour {
			t.Fatalf("record TTL %v, want about 48h", ttl)
		}
	})
}

func TestInvalidInputChangesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		long := make([]byte, 10<<10)
		for i := range long {
			long[i] = 'a'
		}
		bad := []ReserveRequest{
			{OperationID: "", Tool: "t"},
			{OperationID: "a\nb", Tool: "t"},
			{OperationID: "a\x00b", Tool: "t"},
			{OperationID: "\xff\xfe", Tool: "t"},
			{OperationID: string(long), Tool: "t"},
			{OperationID: "ok", Tool: ""},
			{OperationID: "ok", Tool: "bad tool*"},
			{OperationID: "ok", Tool: "t", Effect: 9},
			{OperationID: "ok", Tool: "t", ParamsSHA256: []byte{1, 2}},
			{OperationID: "ok", Tool: "t", ParamsSHA256: make([]byte, 32), Params: map[string]any{}},
			{OperationID: "ok", Tool: "t", Params: map[string]any{"x": nan()}},
			{OperationID: "ok", Tool: "t", Holder: string(long)},
			{OperationID: "ok", Tool: "t", RetainUntil: time.Now().Add(20 * 365 * 24 * time.Hour)},
		}
		for _, req := range bad {
			_, err := e.l.Reserve(e.ctx, e.who, req)
			ie := wantKind(t, err, KindInvalid)
			if len(ie.Violations) == 0 {
				t.Fatalf("no violations for %q", req.OperationID)
			}
		}
		for _, call := range []func() error{
			func() error { _, err := e.complete(t, "ok", 0, OutcomeSucceeded, nil, nil); return err },
			func() error { _, err := e.complete(t, "ok", 1, 0, nil, nil); return err },
			func() error { _, err := e.complete(t, "ok", 1, OutcomeFailedFinal, &Result{}, nil); return err },
			func() error {
				_, err := e.complete(t, "ok", 1, OutcomeSucceeded, &Result{Data: []byte("[1]")}, nil)
				return err
			},
			func() error { _, err := e.reconcile(t, "ok", 0, nil); return err },
			func() error { _, err := e.reconcile(t, "ok", FindingNotApplied, &Result{}); return err },
			func() error {
				_, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{PageToken: "garbage!"})
				return err
			},
			func() error {
				_, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{States: []State{StateSucceeded}})
				return err
			},
		} {
			wantKind(t, call(), KindInvalid)
		}
		n, err := countKeys(e, e.who.Tenant)
		if err != nil || n != 0 {
			t.Fatalf("refused requests wrote %d keys (%v)", n, err)
		}
	})
}

// countKeys counts the keys that name the tenant (on every master of a
// cluster).
func countKeys(e *env, tenant string) (int, error) {
	pattern := "*:" + encodeComponent(tenant) + "*"
	if cc, ok := e.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		n := 0
		err := cc.ForEachMaster(e.ctx, func(ctx context.Context, c *redis.Client) error {
			keys, err := c.Keys(ctx, pattern).Result()
			mu.Lock()
			n += len(keys)
			mu.Unlock()
			return err
		})
		return n, err
	}
	keys, err := e.rdb.Keys(e.ctx, pattern).Result()
	return len(keys), err
}

func TestConsequentialFieldsBoundAtCreation(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// Created while the policy fingerprints only amount and currency.
		e.reserve(t, "op", "fields.refund", map[string]any{"amount": 10.0, "currency": "EUR", "memo": "a"}, "h1")
		// Another instance (or a reloaded policy) fingerprints every field.
		all, err := New(e.rdb, Options{})
		if err != nil {
			t.Fatal(err)
		}
		retry := func(l *Ledger, params map[string]any) (*ReserveResult, error) {
			return l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "fields.refund", Params: params, PermitID: "permit-1", Holder: "h1"})
		}
		res, err := retry(all, map[string]any{"amount": 10.0, "currency": "EUR", "memo": "b"})
		if err != nil || res.Decision != DecisionExecute {
			t.Fatalf("retry under the changed policy = %v, %v; want the same claim", res, err)
		}
		_, err = retry(all, map[string]any{"amount": 11.0, "currency": "EUR", "memo": "a"})
		wantKind(t, err, KindKeyReused)

		// And the other way round: created over all fields, retried under a
		// policy that names fields.
		if _, err := all.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op2", Tool: "fields.refund", Params: map[string]any{"amount": 1.0, "memo": "x"}, PermitID: "p", Holder: "h"}); err != nil {
			t.Fatal(err)
		}
		_, err = e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op2", Tool: "fields.refund", Params: map[string]any{"amount": 1.0, "memo": "y"}, PermitID: "p", Holder: "h"})
		wantKind(t, err, KindKeyReused)
		res, err = e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op2", Tool: "fields.refund", Params: map[string]any{"memo": "x", "amount": 1.0}, PermitID: "p", Holder: "h"})
		if err != nil || res.Decision != DecisionExecute {
			t.Fatalf("same params under the narrower policy = %v, %v", res, err)
		}
	})
}

func TestLateSuccessCorrectsConcludedFailure(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// The last attempt's lease runs out; a reconciler finds nothing yet;
		// the ledger concludes the operation failed for good.
		var last *Operation
		for range 3 {
			last = e.reserve(t, "op", "expiring.refund", map[string]any{"amount": 10.0}, "h").Operation
			if last.Attempt < 3 {
				if _, err := e.complete(t, "op", last.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		waitLeaseExpiry()
		if res := e.reserve(t, "op", "expiring.refund", map[string]any{"amount": 10.0}, "h2"); res.Decision != DecisionReconcile {
			t.Fatalf("decision = %v", res.Decision)
		}
		if _, err := e.reconcile(t, "op", FindingNotApplied, nil); err != nil {
			t.Fatal(err)
		}
		res := e.reserve(t, "op", "expiring.refund", map[string]any{"amount": 10.0}, "h3")
		if res.Operation.State != StateFailedFinal || res.Operation.Reason != "RETRIES_EXHAUSTED" {
			t.Fatalf("after exhaustion = %+v", res.Operation)
		}
		// The slow worker did apply it, and says so with the latest token.
		done, err := e.complete(t, "op", last.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil)
		if err != nil || done.State != StateSucceeded || done.Result.ResourceID != "r" || done.Failure != nil {
			t.Fatalf("late success = %+v, %v", done, err)
		}
		got := e.lookup(t, "op")
		if h := got.History[len(got.History)-1]; h.From != StateFailedFinal || h.To != StateSucceeded || h.Detail != "late report after RETRIES_EXHAUSTED" {
			t.Fatalf("last history entry = %+v", h)
		}
		stored, _ := e.rdb.Get(e.ctx, e.opKeys("op").all[0]).Result()
		if tomb, _, err := decodeRecord(stored); err != nil || tomb.State != StateSucceeded {
			t.Fatalf("stored record (the tombstone after the retention) = %+v, %v", tomb, err)
		}
		if ttl, _ := e.rdb.PTTL(e.ctx, e.opKeys("op").all[0]).Result(); ttl <= 0 {
			t.Fatalf("record TTL %v after the late success", ttl)
		}
		// A final failure the worker itself reported stays final.
		o := e.execute(t, "final", "payments.refund")
		if _, err := e.complete(t, "final", o.FencingToken, OutcomeFailedFinal, nil, &Failure{Code: "declined"}); err != nil {
			t.Fatal(err)
		}
		_, err = e.complete(t, "final", o.FencingToken, OutcomeSucceeded, nil, nil)
		wantKind(t, err, KindCompletionConflict)
	})
}

// inLeaseIndex reports whether the operation has an entry in its shard's
// lease index (which other tenants' operations share).
func inLeaseIndex(e *env, id string) bool {
	k := e.opKeys(id)
	_, err := e.rdb.ZScore(e.ctx, k.all[2], k.member).Result()
	return err == nil
}

// TestUnresolvedLimit: a tenant holds at most its limit of unresolved
// operations over all shards, small or large, also when 64 Reserves race;
// retries of held operations still work, a resolved one makes room, other
// tenants are not limited by it, and two Ledgers on one store keep it when
// each reads the counts again before it decides (as it does near the limit
// once nearAge has passed).
func TestUnresolvedLimit(t *testing.T) {
	cases := []struct {
		name    string
		limit   int
		ledgers int // sharing the store, called in turn
		racing  int // concurrent Reserves first
	}{
		{"one", 1, 1, 0},
		{"ten", 10, 1, 0},
		{"one per shard", NumShards, 1, 0},
		{"a thousand", 1000, 1, 0},
		{"ten, 64 racing", 10, 1, 64},
		{"ten, two ledgers", 10, 2, 0},
	}
	eachBackend(t, func(t *testing.T, e *env) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				who := e.who
				who.Tenant += "-" + randomHex(4)
				var ls []*Ledger
				for range c.ledgers {
					l, err := New(e.lrdb, Options{Policies: e.l.policies, UnresolvedLimit: func(tenant string) int {
						if tenant == who.Tenant {
							return c.limit
						}
						return 0
					}})
					if err != nil {
						t.Fatal(err)
					}
					ls = append(ls, l)
				}
				reserve := func(l *Ledger, who Principal, id string) (*ReserveResult, error) {
					return l.Reserve(e.ctx, who, ReserveRequest{OperationID: id, Tool: "payments.refund", PermitID: "p", Holder: "h"})
				}
				var held []string
				n := 0
				next := func() string { n++; return "op-" + itoa(int64(n)) }
				if c.racing > 0 {
					var mu sync.Mutex
					var wg sync.WaitGroup
					for range c.racing {
						id := next()
						wg.Go(func() {
							_, err := reserve(ls[0], who, id)
							mu.Lock()
							defer mu.Unlock()
							switch {
							case err == nil:
								held = append(held, id)
							case KindOf(err) != KindQuotaExceeded:
								t.Error(err)
							}
						})
					}
					wg.Wait()
					if len(held) > c.limit {
						t.Fatalf("%d racing Reserves created %d operations, limit %d", c.racing, len(held), c.limit)
					}
				}
				for i := 0; len(held) < c.limit; i++ {
					l := ls[i%len(ls)]
					if len(ls) > 1 {
						time.Sleep(nearAge + 5*time.Millisecond) // the other's counts are stale
					}
					id := next()
					if _, err := reserve(l, who, id); err != nil {
						t.Fatalf("%s, holding %d of %d: %v", id, len(held), c.limit, err)
					}
					held = append(held, id)
				}
				refused := next()
				for _, l := range ls {
					time.Sleep(nearAge + 5*time.Millisecond)
					if _, err := reserve(l, who, refused); KindOf(err) != KindQuotaExceeded {
						t.Fatalf("a new operation beyond the limit: %v, want KindQuotaExceeded", err)
					}
				}
				if got := unresolvedOf(t, e, who.Tenant); got != c.limit {
					t.Fatalf("%d unresolved operations, limit %d", got, c.limit)
				}
				res, err := reserve(ls[0], who, held[0])
				if err != nil || res.Decision != DecisionExecute {
					t.Fatalf("retry under the limit = %v, %v", res, err)
				}
				if _, err := ls[0].Complete(e.ctx, who, CompleteRequest{OperationID: held[0], FencingToken: res.Operation.FencingToken, Outcome: OutcomeSucceeded}); err != nil {
					t.Fatal(err)
				}
				if _, err := reserve(ls[len(ls)-1], who, refused); err != nil {
					t.Fatalf("after resolving one: %v", err)
				}
				other := who
				other.Tenant += "-other"
				if _, err := reserve(ls[0], other, next()); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// unresolvedOf counts a tenant's unresolved operations in every shard.
func unresolvedOf(t *testing.T, e *env, tenant string) int {
	t.Helper()
	n := 0
	for s := range NumShards {
		c, err := e.rdb.ZCard(e.ctx, e.l.keys.unresolved(s, encodeComponent(tenant))).Result()
		if err != nil {
			t.Fatal(err)
		}
		n += int(c)
	}
	return n
}

// liveFor returns the live counts of one tenant by state.
func liveFor(t *testing.T, e *env) map[State]int64 {
	t.Helper()
	counts, err := e.l.LiveCounts(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[State]int64{}
	for _, c := range counts {
		if c.Tenant == e.who.Tenant {
			out[c.State] += c.N
		}
	}
	return out
}

// TestLiveCountsAndOverdue: the live counts follow every state, and an
// operation nothing moves within its recovery window is overdue: UNKNOWN,
// PENDING that nobody retries, and an idempotent claim past its lease (once
// swept); an irreversible claim past its lease becomes UNKNOWN instead.
// Moving it (a finding, a retry, a reclaim, a Complete) ends that.
func TestLiveCountsAndOverdue(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		pol, err := ParsePolicies([]byte("tools:\n  - match: \"tiny.lookup\"\n    effect: IDEMPOTENT\n    lease: 20ms\n    recovery_window: 1s\n" +
			"  - match: \"tiny.*\"\n    recovery_window: 50ms\n"))
		if err != nil {
			t.Fatal(err)
		}
		l, err := New(e.lrdb, Options{Policies: pol})
		if err != nil {
			t.Fatal(err)
		}
		e.l = l
		e.execute(t, "running", "tiny.refund")
		p := e.execute(t, "pending", "tiny.refund")
		if _, err := e.complete(t, "pending", p.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
			t.Fatal(err)
		}
		u := e.execute(t, "unknown", "tiny.refund")
		if _, err := e.markUnknown(t, "unknown", u.FencingToken); err != nil {
			t.Fatal(err)
		}
		d := e.execute(t, "done", "tiny.refund")
		if _, err := e.complete(t, "done", d.FencingToken, OutcomeSucceeded, nil, nil); err != nil {
			t.Fatal(err)
		}
		e.execute(t, "abandoned", "tiny.lookup")
		got := liveFor(t, e)
		if got[StateRunning] != 2 || got[StatePending] != 1 || got[StateUnknown] != 1 || len(got) != 3 {
			t.Fatalf("live counts = %v", got)
		}
		overdue := func() map[string]int64 {
			t.Helper()
			ov, err := e.l.Overdue(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]int64{}
			for _, o := range ov {
				if o.Tenant == e.who.Tenant {
					out[o.Tool+" "+o.Effect.String()+" "+o.State.String()] += o.N
				}
			}
			return out
		}
		time.Sleep(100 * time.Millisecond)
		if _, err := e.l.Sweep(e.ctx); err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{
			"tiny.refund IRREVERSIBLE UNKNOWN": 1,
			"tiny.refund IRREVERSIBLE PENDING": 1,
		}
		if got := overdue(); !maps.Equal(got, want) {
			t.Fatalf("overdue = %v, want %v", got, want)
		}
		time.Sleep(time.Second) // the idempotent claim: lease end + window
		want["tiny.lookup IDEMPOTENT RUNNING"] = 1
		if got := overdue(); !maps.Equal(got, want) {
			t.Fatalf("overdue = %v, want %v", got, want)
		}
		if _, err := e.reconcile(t, "unknown", FindingApplied, nil); err != nil {
			t.Fatal(err)
		}
		if r := e.reserve(t, "abandoned", "tiny.lookup", map[string]any{"amount": 10.0}, "h2"); r.Decision != DecisionExecute || r.Operation.Attempt != 2 {
			t.Fatalf("reclaim = %v, attempt %d", r.Decision, r.Operation.Attempt)
		}
		want = map[string]int64{"tiny.refund IRREVERSIBLE PENDING": 1}
		if got := overdue(); !maps.Equal(got, want) {
			t.Fatalf("overdue after moving them = %v, want %v", got, want)
		}
		if r := e.reserve(t, "pending", "tiny.refund", map[string]any{"amount": 10.0}, "h2"); r.Decision != DecisionExecute {
			t.Fatalf("retry of the pending one = %v", r.Decision)
		}
		if got := overdue(); len(got) != 0 {
			t.Fatalf("overdue after the retry = %v, want none", got)
		}
		if got := liveFor(t, e); got[StateUnknown] != 0 || got[StateRunning] != 3 || got[StatePending] != 0 {
			t.Fatalf("live counts after moving them = %v", got)
		}
	})
}

func TestObserverSeesTransitionsDecisionsAndRefusals(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		seen := observe(t, e)
		o := e.execute(t, "op", "payments.refund")
		time.Sleep(5 * time.Millisecond)
		if _, err := e.complete(t, "op", o.FencingToken, OutcomeSucceeded, nil, nil); err != nil {
			t.Fatal(err)
		}
		_, _ = e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "op", Tool: "payments.refund", Params: map[string]any{"amount": 1.0}, PermitID: "permit-1", Holder: "h"})
		_, _ = e.complete(t, "op", o.FencingToken+1, OutcomeSucceeded, nil, nil)
		var kinds []string
		for _, ev := range seen() {
			switch ev.Type {
			case EventTransition:
				kinds = append(kinds, "transition:"+ev.From.String()+">"+ev.To.String()+":"+ev.Reason)
				if ev.To == StateSucceeded && ev.Dwell <= 0 {
					t.Errorf("no dwell time in RUNNING: %+v", ev)
				}
			case EventDecision:
				kinds = append(kinds, "decision:"+ev.Decision.String())
			case EventConflict:
				kinds = append(kinds, "conflict:"+strings.Join(ev.Differs, ","))
			case EventRefused:
				kinds = append(kinds, "refused:"+ev.ErrKind.String())
			}
			if ev.Type != EventScript && ev.Tenant != e.who.Tenant {
				t.Errorf("event without the tenant: %+v", ev)
			}
		}
		want := "transition:UNSPECIFIED>RUNNING:RESERVED decision:EXECUTE transition:RUNNING>SUCCEEDED:SUCCEEDED conflict:params refused:stale fencing token"
		if strings.Join(kinds, " ") != want {
			t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(kinds, " "), want)
		}
	})
}

// TestObserverSeesRenewsLeaseExpiry: a Renew that finds an irreversible
// operation's lease over moves it to UNKNOWN (LEASE_EXPIRED) itself, and
// reports that transition, with its dwell in RUNNING, as the sweeper's
// would be.
func TestObserverSeesRenewsLeaseExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		seen := observe(t, e)
		unswept(func() {
			o := e.execute(t, "renewed-late", "expiring.refund")
			waitLeaseExpiry()
			_, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "renewed-late", FencingToken: o.FencingToken})
			if le := wantKind(t, err, KindStaleToken); le.State != StateUnknown {
				t.Fatalf("Renew after the lease: state %v, want UNKNOWN", le.State)
			}
		})
		var moves []Event
		for _, ev := range seen() {
			if ev.Type == EventTransition && ev.To == StateUnknown {
				moves = append(moves, ev)
			}
		}
		if len(moves) != 1 || moves[0].From != StateRunning || moves[0].Reason != "LEASE_EXPIRED" || moves[0].Op != "Renew" || moves[0].Dwell < 150*time.Millisecond {
			t.Fatalf("transitions to UNKNOWN: %+v, want Renew's RUNNING > UNKNOWN (LEASE_EXPIRED) after its lease", moves)
		}
	})
}

// observe gives e a ledger on the same store whose events are kept, and
// returns what it has seen so far.
func observe(t *testing.T, e *env) func() []Event {
	t.Helper()
	var mu sync.Mutex
	var events []Event
	l, err := New(e.lrdb, Options{Policies: e.l.policies, Observer: func(ev Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}})
	if err != nil {
		t.Fatal(err)
	}
	e.l = l
	return func() []Event {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(events)
	}
}
