package server_test

import (
	"testing"
	"time"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

// TestPoliciesOverTheWire: contract.md §6: the policy of an operation comes from
// the config file, per tenant and per tool pattern (the first matching rule,
// over the defaults), and shows in the snapshot: the effect when the request
// leaves it unspecified, the lease, max_attempts, and the recovery window
// (recovery_deadline is unknown_since plus it).
func TestPoliciesOverTheWire(t *testing.T) {
	pol, err := ledger.ParsePolicies([]byte(`
defaults:
  max_attempts: 4
  recovery_window: 20m
tools:
  - match: "crm.*"
    tenant: "vip-*"
    effect: idempotent
    lease: 90s
    max_attempts: 7
  - match: "crm.*"
    lease: 45s
  - match: "search.*"
    effect: read_only
`))
	if err != nil {
		t.Fatal(err)
	}
	kr := newKeyring(t)
	suffix := randomHex(4)
	vip := as(kr.add(t, "vip", "vip-"+suffix, "agent", false))
	plain := as(kr.add(t, "plain", "plain-"+suffix, "agent", false))
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{}, ledger.Options{Policies: pol}, nil)

	for _, tc := range []struct {
		name        string
		caller      string
		tool        string
		effect      ledgerv1.Effect // in the request
		wantEffect  ledgerv1.Effect
		wantLease   time.Duration
		wantMax     uint32
		wantRecover time.Duration
	}{
		{"the tenant's rule", "vip", "crm.sync", 0, idempotent, 90 * time.Second, 7, 20 * time.Minute},
		{"the tool's rule for any tenant", "plain", "crm.sync", 0, irreversible, 45 * time.Second, 4, 20 * time.Minute},
		{"another tool's rule", "plain", "search.query", 0, readOnly, 30 * time.Second, 4, 20 * time.Minute},
		{"the request's effect wins", "plain", "crm.sync", idempotent, idempotent, 45 * time.Second, 4, 20 * time.Minute},
		{"no rule", "vip", "payments.refund", 0, irreversible, 30 * time.Second, 4, 20 * time.Minute},
	} {
		caller := vip
		if tc.caller == "plain" {
			caller = plain
		}
		id := "policy-" + suffix + ":" + tc.name
		req := reserveReq(id, tc.tool, nil, newHolder())
		req.Effect = tc.effect
		res, err := e.c.Reserve(caller, req)
		if err != nil || res.Decision != execute {
			t.Fatalf("%s: Reserve = %v, %v", tc.name, res, err)
		}
		op := res.Operation
		if lease := op.LeaseExpiresAt.AsTime().Sub(op.CreatedAt.AsTime()); op.Effect != tc.wantEffect || lease != tc.wantLease || op.MaxAttempts != tc.wantMax {
			t.Errorf("%s: effect %v, lease %v, max_attempts %d; want %v, %v, %d", tc.name, op.Effect, lease, op.MaxAttempts, tc.wantEffect, tc.wantLease, tc.wantMax)
		}
		u, err := e.c.MarkUnknown(caller, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: op.FencingToken})
		if err != nil {
			t.Fatal(err)
		}
		if w := u.Operation.RecoveryDeadline.AsTime().Sub(u.Operation.UnknownSince.AsTime()); w != tc.wantRecover {
			t.Errorf("%s: recovery_deadline is unknown_since + %v, want + %v", tc.name, w, tc.wantRecover)
		}
	}
}
