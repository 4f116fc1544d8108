package ledger

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/redistest"
)

// dump reads everything the ledger stores about a tenant, to compare before
// and after a refused call.
func dump(t *testing.T, e *env) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := e.rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		v, err := e.rdb.Dump(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

// TestOutOfMemoryRefusesBeforeFirstWrite puts Redis over maxmemory
// (noeviction) and checks that every write script is refused whole: the
// caller gets KindUnavailable and not one key changes. Once memory is
// available the same calls succeed.
func TestOutOfMemoryRefusesBeforeFirstWrite(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	rdb := srv.Client(t)
	pol, _ := ParsePolicies([]byte(testPolicy))
	e := newEnv(t, rdb, pol)
	if err := e.l.LoadScripts(e.ctx); err != nil {
		t.Fatal(err)
	}
	running := e.execute(t, "running", "payments.refund")
	pending := e.execute(t, "pending", "payments.refund")
	if _, err := e.complete(t, "pending", pending.FencingToken, OutcomeFailedRetryable, nil, nil); err != nil {
		t.Fatal(err)
	}
	before := dump(t, e)

	if err := rdb.ConfigSet(e.ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Reserve (create)": func() error {
			_, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "new", Tool: "payments.refund", PermitID: "p", Holder: "h"})
			return err
		},
		"Reserve (claim)": func() error {
			_, err := e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "pending", Tool: "payments.refund", Params: map[string]any{"amount": 10.0}, PermitID: "permit-1", Holder: "h"})
			return err
		},
		"Complete": func() error {
			_, err := e.complete(t, "running", running.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r"}, nil)
			return err
		},
		"MarkUnknown": func() error { _, err := e.markUnknown(t, "running", running.FencingToken); return err },
		"Renew": func() error {
			_, err := e.l.Renew(e.ctx, e.who, RenewRequest{OperationID: "running", FencingToken: running.FencingToken})
			return err
		},
		"Reconcile": func() error { _, err := e.reconcile(t, "pending", FindingAbandon, nil); return err },
	}
	for name, call := range calls {
		err := call()
		if KindOf(err) != KindUnavailable || !strings.Contains(err.Error(), "OOM") {
			t.Fatalf("%s under OOM: %v, want KindUnavailable (OOM)", name, err)
		}
	}
	after := dump(t, e)
	if len(after) != len(before) {
		t.Fatalf("keys before %d, after %d", len(before), len(after))
	}
	for k, v := range before {
		if after[k] != v {
			t.Fatalf("key %s changed under OOM", k)
		}
	}
	// Reads still work.
	if _, err := e.l.Lookup(e.ctx, e.who, "running"); err != nil {
		t.Fatalf("Lookup under OOM: %v", err)
	}

	if err := rdb.ConfigSet(e.ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Complete", "Reserve (create)"} {
		if err := calls[name](); err != nil {
			t.Fatalf("%s after OOM: %v", name, err)
		}
	}
	if got := reasons(e.lookup(t, "running")); !slices.Equal(got, []string{"RESERVED", "SUCCEEDED"}) {
		t.Fatalf("history = %v", got)
	}
}
