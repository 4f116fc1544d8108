package server_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

// TestIDsWithAnyCharacterKeepToTheirTenant: tenants and operation ids made
// of braces, colons, percent escapes and non-ASCII text go through every
// step of an operation's life over the wire (Reserve, the sweeper's lease
// expiry, ListUnresolved, Reconcile, the replay) on a real redis-server, a
// Redis Cluster and the embedded engine. Tenant "t" with id "u:v" and tenant
// "t:u" with id "v" join to the same text; each operation must stay its own
// tenant's, and each effect must be applied once.
func TestIDsWithAnyCharacterKeepToTheirTenant(t *testing.T) {
	run := randomHex(4)
	tenants := map[string][]string{ // tenant -> its operation ids
		"t-" + run:           {"u:v", "{s07}", "a}{b", "%41", "x y"},
		"t-" + run + ":u":    {"v", "%2541", "ünï→code:{}"},
		"{s01}-" + run + ":": {"u:v", "*", "}{"},
	}
	// Credentials: a reconciler key per tenant.
	doc := map[string]any{}
	var keys []map[string]any
	secrets := map[string]string{} // tenant -> API key
	i := 0
	for tenant := range tenants {
		i++
		id := "k" + string(rune('0'+i))
		key, hash, err := server.NewAPIKey(id)
		if err != nil {
			t.Fatal(err)
		}
		secrets[tenant] = key
		keys = append(keys, map[string]any{"id": id, "tenant": tenant, "scopes": []string{"reconciler"}, "secret_sha256": hash})
	}
	doc["keys"] = keys
	raw, _ := json.Marshal(doc)
	creds, err := server.ParseCredentials(raw)
	if err != nil {
		t.Fatal(err)
	}

	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := startSweeping(t, rdb, creds)
		d := newDestination()
		key := func(tenant, id string) string { return tenant + "\x00" + id }
		reserve := func(tenant, id string) *ledgerv1.ReserveResponse {
			t.Helper()
			res, err := c.Reserve(as(secrets[tenant]), reserveReq(id, "short.refund", mustStruct(t, map[string]any{"amount": 5}), newHolder()))
			if err != nil {
				t.Fatalf("Reserve(%q, %q): %v", tenant, id, err)
			}
			return res
		}

		// Every operation is claimed and applied; its worker dies.
		for tenant, ids := range tenants {
			for _, id := range ids {
				if res := reserve(tenant, id); res.Decision != ledgerv1.Decision_DECISION_EXECUTE {
					t.Fatalf("Reserve(%q, %q) = %v, want EXECUTE", tenant, id, res.Decision)
				}
				if _, err := d.apply(key(tenant, id), "5"); err != nil {
					t.Fatal(err)
				}
			}
		}

		// The sweeper makes each one UNKNOWN, and each tenant lists exactly
		// its own operations, under their ids as sent.
		for tenant, ids := range tenants {
			want := slices.Sorted(slices.Values(ids))
			var got []string
			deadline := time.Now().Add(10 * time.Second)
			for {
				list, err := c.ListUnresolved(as(secrets[tenant]), &ledgerv1.ListUnresolvedRequest{States: []ledgerv1.State{ledgerv1.State_STATE_UNKNOWN}})
				if err != nil {
					t.Fatal(err)
				}
				got = got[:0]
				for _, o := range list.Operations {
					got = append(got, o.OperationId)
				}
				slices.Sort(got)
				if slices.Equal(got, want) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("tenant %q lists UNKNOWN %q, want %q", tenant, got, want)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}

		// Tenant "t" has no operation "v"; tenant "t:u" has one.
		_, err := c.Lookup(as(secrets["t-"+run]), &ledgerv1.LookupRequest{OperationId: "v"})
		wantReason(t, err, codes.NotFound, "NOT_FOUND")

		// Each is reconciled from its own destination record, and replays it.
		for tenant, ids := range tenants {
			for _, id := range ids {
				rid, ok := d.find(key(tenant, id))
				if !ok {
					t.Fatalf("no effect for (%q, %q)", tenant, id)
				}
				rec, err := c.Reconcile(as(secrets[tenant]), &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_APPLIED,
					Result: &ledgerv1.Result{ResourceId: rid}})
				if err != nil || rec.Operation.State != ledgerv1.State_STATE_SUCCEEDED {
					t.Fatalf("Reconcile(%q, %q) = %v, %v", tenant, id, rec, err)
				}
			}
		}
		for tenant, ids := range tenants {
			list, err := c.ListUnresolved(as(secrets[tenant]), &ledgerv1.ListUnresolvedRequest{})
			if err != nil || len(list.Operations) != 0 {
				t.Fatalf("tenant %q still lists %v (%v)", tenant, list.GetOperations(), err)
			}
			for _, id := range ids {
				res := reserve(tenant, id)
				want, _ := d.find(key(tenant, id))
				if res.Decision != ledgerv1.Decision_DECISION_REPLAY || res.Operation.Result.GetResourceId() != want || res.Operation.OperationId != id {
					t.Fatalf("Reserve(%q, %q) again = %v %q, want REPLAY of %q", tenant, id, res.Decision, res.Operation.Result.GetResourceId(), want)
				}
				if n := d.count(key(tenant, id)); n != 1 {
					t.Fatalf("(%q, %q) applied %d times, want 1", tenant, id, n)
				}
			}
		}
	})
}

// startSweeping serves a ledger with authentication and its sweeper running,
// and returns a client of it.
func startSweeping(t *testing.T, rdb redis.UniversalClient, creds *server.Credentials) ledgerv1.LedgerServiceClient {
	t.Helper()
	pol, err := ledger.ParsePolicies([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(&ledgertest.Buffer{}, nil))
	l, err := ledger.New(rdb, ledger.Options{Policies: pol, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(server.Config{Ledger: l, Logger: log, Auth: server.NewAuthenticator(creds)})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.RunSweeper(ctx, 50*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done; svc.GRPC.Stop() })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return ledgerv1.NewLedgerServiceClient(conn)
}
