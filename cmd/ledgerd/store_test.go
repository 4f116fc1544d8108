package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// TestRedisModesAsRestrictedUsers runs ledgerd in cluster and sentinel
// mode as the Redis users docs/security.md shows for them, with the
// credentials where docs/configuration.md (section 3.2) puts them in the
// URL: a Reserve, Complete and Lookup go through, and no server refused the
// user anything but CONFIG GET (the durability check's, which the
// documented users leave out).
func TestRedisModesAsRestrictedUsers(t *testing.T) {
	cycle := func(t *testing.T, c ledgerv1.LedgerServiceClient, out fmt.Stringer) {
		t.Helper()
		ctx := context.Background()
		r, err := c.Reserve(ctx, &ledgerv1.ReserveRequest{OperationId: "wf-1:step-1", Tool: "tickets.create", Holder: "h"})
		if err != nil || r.Decision != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("Reserve = %v, %v\n%s", r, err, out)
		}
		if _, err := c.Complete(ctx, &ledgerv1.CompleteRequest{OperationId: "wf-1:step-1", FencingToken: r.Operation.FencingToken, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED}); err != nil {
			t.Fatalf("Complete: %v\n%s", err, out)
		}
		o, err := c.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: "wf-1:step-1"})
		if err != nil || o.GetOperation().GetState() != ledgerv1.State_STATE_SUCCEEDED {
			t.Fatalf("Lookup = %v, %v\n%s", o, err, out)
		}
	}
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.SharedCluster(t)
		// The cluster outlives the test (-count=N reruns it): a user and
		// keys of this run.
		run := fmt.Sprintf("%x", time.Now().UnixNano())
		prefix, user := "aclc"+run, "ledger-"+run
		for _, n := range cl.Nodes {
			n.CreateUser(t, user, "cluster-pw", ledger.ClusterACLRules(prefix))
		}
		addrs := cl.Addrs()
		url := "redis://" + user + ":cluster-pw@" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
		c, out := serve(t, "--redis-mode", "cluster", "--redis-url", url, "--key-prefix", prefix, "--wait-replicas", "1", "--wait-timeout", "2s")
		cycle(t, c, out)
		for _, n := range cl.Nodes {
			n.RequireNoACLDenials(t, user, "config|get")
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		master := redistest.Start(t)
		sentinel := redistest.StartSentinel(t, master, "aclmaster")
		master.CreateUser(t, "ledger", "master-pw", ledger.ACLRules(ledger.DefaultPrefix))
		sentinel.CreateUser(t, "ledger", "sentinel-pw", ledger.SentinelACLRules())
		url := "redis://ledger:sentinel-pw@" + sentinel.Addr + "?master_name=aclmaster&username=ledger&password=master-pw"
		c, out := serve(t, "--redis-mode", "sentinel", "--redis-url", url)
		cycle(t, c, out)
		master.RequireNoACLDenials(t, "ledger", "config|get")
		sentinel.RequireNoACLDenials(t, "ledger", "config|get")
	})
}
