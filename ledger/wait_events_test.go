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

// TestTransitionsReportedWhenNotReplicated: with WaitReplicas and no replica
// every call answers KindNotReplicated, but its write stands on the primary:
// the transition it made is reported, once (its repeat, answered the same,
// makes none).
func TestTransitionsReportedWhenNotReplicated(t *testing.T) {
	primary := redistest.Start(t)
	pol, _ := ParsePolicies([]byte(testPolicy))
	var tl transitionLog
	l, err := New(primary.Client(t), Options{Policies: pol, Observer: tl.observe, WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New(primary.Client(t), Options{Policies: pol})
	if err != nil {
		t.Fatal(err)
	}
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
