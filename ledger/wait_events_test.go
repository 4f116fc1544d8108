package ledger

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/redistest"
)

// transitionLog is an Observer that keeps the transitions it is told of.
type transitionLog struct {
	mu   sync.Mutex
	seen []string
}

func (tl *transitionLog) observe(e Event) {
	if e.Type != EventTransition {
		return
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.seen = append(tl.seen, e.From.String()+">"+e.To.String()+":"+e.Reason)
}

// list returns the transitions seen so far, in order.
func (tl *transitionLog) list() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return strings.Join(tl.seen, " ")
}

// unreplicated returns two ledgers on one fresh redis-server without a
// replica: l, with observe and WaitReplicas 1, whose every call answers
// KindNotReplicated after its script ran, and plain, without either, to read
// the store.
func unreplicated(t *testing.T, observe Observer) (l, plain *Ledger) {
	t.Helper()
	primary := redistest.Start(t)
	pol, _ := ParsePolicies([]byte(testPolicy))
	l, err := New(primary.Client(t), Options{Policies: pol, Observer: observe, WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	plain, err = New(primary.Client(t), Options{Policies: pol})
	if err != nil {
		t.Fatal(err)
	}
	return l, plain
}

// TestTransitionsReportedWhenNotReplicated: with WaitReplicas and no replica
// every call answers KindNotReplicated, but its write stands on the primary:
// the transition it made is reported, once (its repeat, answered the same,
// makes none).
func TestTransitionsReportedWhenNotReplicated(t *testing.T) {
	var tl transitionLog
	l, plain := unreplicated(t, tl.observe)
	ctx := context.Background()
	who := Principal{Tenant: "t", ID: "a"}
	req := ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"}
	// The claim's token, read from the store after the Reserve (its answer
	// is an error).
	done := CompleteRequest{OperationID: "op", Outcome: OutcomeSucceeded}
	steps := []struct {
		name string
		call func() error
		want string // the transitions seen after the call
		st   State  // the record's state after the call
	}{
		{"Reserve", func() error { _, err := l.Reserve(ctx, who, req); return err }, "UNSPECIFIED>RUNNING:RESERVED", StateRunning},
		{"Reserve repeated", func() error { _, err := l.Reserve(ctx, who, req); return err }, "UNSPECIFIED>RUNNING:RESERVED", StateRunning},
		{"Complete", func() error { _, err := l.Complete(ctx, who, done); return err },
			"UNSPECIFIED>RUNNING:RESERVED RUNNING>SUCCEEDED:SUCCEEDED", StateSucceeded},
		{"Complete repeated", func() error { _, err := l.Complete(ctx, who, done); return err },
			"UNSPECIFIED>RUNNING:RESERVED RUNNING>SUCCEEDED:SUCCEEDED", StateSucceeded},
	}
	for _, s := range steps {
		if err := s.call(); KindOf(err) != KindNotReplicated {
			t.Fatalf("%s: %v, want KindNotReplicated", s.name, err)
		}
		o, err := plain.Lookup(ctx, who, "op")
		if err != nil || o.State != s.st {
			t.Fatalf("after %s: Lookup = %+v, %v; want %v", s.name, o, err, s.st)
		}
		done.FencingToken = o.FencingToken
		if got := tl.list(); got != s.want {
			t.Errorf("after %s the transitions reported are %q, want %q", s.name, got, s.want)
		}
	}
}

// TestTransitionsReportedWhenTheMarkerIsRefused: with WaitReplicas, a
// call's script runs and then the SET of the shard's WAIT marker is
// refused (here: an ACL user whose key patterns cover every key of the
// ledger but the marker's). The call answers the marker's error, as it
// did, but the transition its script made stands in the store, and the
// caller's repeat (refused the same way) makes none: the ledger reports it
// for the call that made it, once, so the metrics count it. A first
// pipeline whose script did not run (NOSCRIPT, the script then sent again
// with EVAL) reports nothing of its own. And the sweeper counts an expired
// claim it made UNKNOWN although the marker after it was refused.
func TestTransitionsReportedWhenTheMarkerIsRefused(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client(t)
	// Every key of the layout (keys.go) but the marker, <prefix>:{sNN}:wait.
	rules := ACLRules(DefaultPrefix)
	all := "~" + DefaultPrefix + ":*"
	if !strings.Contains(rules, all) {
		t.Fatalf("ACLRules %q has no %s to narrow", rules, all)
	}
	var patterns []string
	for _, k := range []string{":op:*", ":unresolved:*", ":leases", ":stats", ":overdue"} {
		patterns = append(patterns, "~"+DefaultPrefix+":{s??}"+k)
	}
	srv.CreateUser(t, "nomarker", "nomarker-password", strings.Replace(rules, all, strings.Join(patterns, " "), 1))
	pol, _ := ParsePolicies([]byte(testPolicy))
	var tl transitionLog
	l, err := New(srv.UserClient(t, "nomarker", "nomarker-password"), Options{Policies: pol, Observer: tl.observe, WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New(admin, Options{Policies: pol})
	if err != nil {
		t.Fatal(err)
	}
	who := Principal{Tenant: "t", ID: "a"}
	req := ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"}
	// The claim's token, read from the store after the Reserve (its answer
	// is an error).
	done := CompleteRequest{OperationID: "op", Outcome: OutcomeSucceeded}
	refused := func(name string, err error) {
		t.Helper()
		// The marker's refusal, answered as before (a script error).
		if KindOf(err) != KindOther || !strings.Contains(err.Error(), "NOPERM") {
			t.Fatalf("%s: %v (kind %v), want the marker's NOPERM as KindOther", name, err, KindOf(err))
		}
	}
	steps := []struct {
		name    string
		call    func() error
		flushed bool   // SCRIPT FLUSH before the call: its first EVALSHA does not run
		want    string // the transitions seen after the call
		st      State  // the record's state after the call
	}{
		{"Reserve", func() error { _, err := l.Reserve(ctx, who, req); return err }, true, "UNSPECIFIED>RUNNING:RESERVED", StateRunning},
		{"Reserve repeated", func() error { _, err := l.Reserve(ctx, who, req); return err }, false, "UNSPECIFIED>RUNNING:RESERVED", StateRunning},
		{"Complete", func() error { _, err := l.Complete(ctx, who, done); return err }, true,
			"UNSPECIFIED>RUNNING:RESERVED RUNNING>SUCCEEDED:SUCCEEDED", StateSucceeded},
		{"Complete repeated", func() error { _, err := l.Complete(ctx, who, done); return err }, false,
			"UNSPECIFIED>RUNNING:RESERVED RUNNING>SUCCEEDED:SUCCEEDED", StateSucceeded},
	}
	for _, s := range steps {
		if s.flushed {
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		refused(s.name, s.call())
		o, err := plain.Lookup(ctx, who, "op")
		if err != nil || o.State != s.st {
			t.Fatalf("after %s: Lookup = %+v, %v; want %v: the script did not run", s.name, o, err, s.st)
		}
		done.FencingToken = o.FencingToken
		if got := tl.list(); got != s.want {
			t.Errorf("after %s the transitions reported are %q, want %q", s.name, got, s.want)
		}
	}

	// An irreversible claim past its lease: the sweeper's expire script
	// makes it UNKNOWN, and the marker after it is refused.
	before := tl.list()
	exp := ReserveRequest{OperationID: "exp", Tool: "expiring.charge", PermitID: "p", Holder: "h"}
	_, err = l.Reserve(ctx, who, exp)
	refused("Reserve expiring.charge", err)
	if got, want := tl.list(), strings.TrimSpace(before+" UNSPECIFIED>RUNNING:RESERVED"); got != want {
		t.Fatalf("after Reserve expiring.charge the transitions reported are %q, want %q", got, want)
	}
	var n int
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Nothing is swept before the lease ends in the store's time.
		if n, err = l.Sweep(ctx); err != nil || n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweeper found no expired claim within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	refused("Sweep", err)
	if n != 1 {
		t.Errorf("Sweep = %d operations made UNKNOWN, want 1", n)
	}
	if o, err := plain.Lookup(ctx, who, "exp"); err != nil || o.State != StateUnknown {
		t.Fatalf("after Sweep: Lookup = %+v, %v; want UNKNOWN", o, err)
	}
	want := strings.TrimSpace(before + " UNSPECIFIED>RUNNING:RESERVED RUNNING>UNKNOWN:LEASE_EXPIRED")
	if got := tl.list(); got != want {
		t.Errorf("after Sweep the transitions reported are %q, want %q", got, want)
	}
	// The claim left the lease index: the next pass finds nothing.
	if n, err := l.Sweep(ctx); n != 0 || err != nil {
		t.Errorf("Sweep again = %d, %v; want 0, nil", n, err)
	}
	if got := tl.list(); got != want {
		t.Errorf("after a second Sweep the transitions reported are %q, want %q", got, want)
	}
}

// TestReconciledReportedWhenNotReplicated: a Reconcile whose script records
// the finding and whose WAIT then falls short (KindNotReplicated) reports
// the finding (EventReconciled, which ledger_reconciliations_total counts)
// for that call, once: the caller's repeat, answered the same, records
// nothing and reports nothing.
func TestReconciledReportedWhenNotReplicated(t *testing.T) {
	var mu sync.Mutex
	var findings []Finding
	l, plain := unreplicated(t, func(e Event) {
		if e.Type == EventReconciled {
			mu.Lock()
			findings = append(findings, e.Finding)
			mu.Unlock()
		}
	})
	ctx := context.Background()
	who := Principal{Tenant: "t", ID: "a"}
	r, err := plain.Reserve(ctx, who, ReserveRequest{OperationID: "op", Tool: "payments.refund", PermitID: "p", Holder: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.MarkUnknown(ctx, who, MarkUnknownRequest{OperationID: "op", FencingToken: r.Operation.FencingToken}); err != nil {
		t.Fatal(err)
	}
	req := ReconcileRequest{OperationID: "op", Finding: FindingApplied, Result: &Result{ResourceID: "re-1"}}
	for _, call := range []string{"Reconcile", "Reconcile repeated"} {
		if _, err := l.Reconcile(ctx, who, req); KindOf(err) != KindNotReplicated {
			t.Fatalf("%s: %v, want KindNotReplicated", call, err)
		}
		o, err := plain.Lookup(ctx, who, "op")
		if err != nil || o.State != StateSucceeded {
			t.Fatalf("after %s: Lookup = %+v, %v; want SUCCEEDED", call, o, err)
		}
		mu.Lock()
		n := len(findings)
		mu.Unlock()
		if n != 1 {
			t.Errorf("after %s: %d findings reported, want 1 (the call whose script recorded it)", call, n)
		}
	}
}
