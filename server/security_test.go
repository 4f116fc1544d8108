package server_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

// keyring makes API keys and the credentials file that lists them.
type keyring struct {
	keys  map[string]string // id -> "<id>.<secret>"
	lines []string
}

func newKeyring(t *testing.T) *keyring { return &keyring{keys: map[string]string{}} }

func (k *keyring) add(t *testing.T, id, tenant, scopes string, disabled bool) string {
	key, hash, err := server.NewAPIKey(id)
	if err != nil {
		t.Fatal(err)
	}
	k.keys[id] = key
	k.lines = append(k.lines, fmt.Sprintf("  - {id: %s, tenant: %s, scopes: [%s], secret_sha256: %s, disabled: %v}", id, tenant, scopes, hash, disabled))
	return key
}

func (k *keyring) doc(extra string) string {
	return "keys:\n" + strings.Join(k.lines, "\n") + "\n" + extra
}

func (k *keyring) creds(t *testing.T, extra string) *server.Credentials {
	c, err := server.ParseCredentials([]byte(k.doc(extra)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// secureEnv is a service with authentication on.
type secureEnv struct {
	conn *grpc.ClientConn
	c    ledgerv1.LedgerServiceClient
	auth *server.Authenticator
	logs *ledgertest.Buffer
	rdb  redis.UniversalClient
}

func startSecure(t *testing.T, rdb redis.UniversalClient, creds *server.Credentials, cfg server.Config, lopts ledger.Options, serverOpts []grpc.ServerOption, dialOpts ...grpc.DialOption) *secureEnv {
	t.Helper()
	logs := &ledgertest.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	lopts.Logger = log
	l, err := ledger.New(rdb, lopts)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Ledger, cfg.Logger = l, log
	cfg.Auth = server.NewAuthenticator(creds)
	svc := server.New(cfg, serverOpts...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	t.Cleanup(svc.GRPC.Stop)
	if len(dialOpts) == 0 {
		dialOpts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(lis.Addr().String(), dialOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &secureEnv{conn: conn, c: ledgerv1.NewLedgerServiceClient(conn), auth: cfg.Auth, logs: logs, rdb: rdb}
}

func as(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
}

func TestS8TenantsAndCredentials(t *testing.T) {
	kr := newKeyring(t)
	// Tenants of this run: the shared stores outlive it (-count=N), and a
	// tenant's lists must hold only this run's operations.
	acmeT, globexT := "acme-"+randomHex(4), "globex-"+randomHex(4)
	acme := kr.add(t, "acme-agent", acmeT, "agent", false)
	acmeRec := kr.add(t, "acme-reconciler", acmeT, "reconciler", false)
	acmeView := kr.add(t, "acme-viewer", acmeT, "viewer", false)
	globex := kr.add(t, "globex-agent", globexT, "agent", false)
	globexRec := kr.add(t, "globex-reconciler", globexT, "reconciler", false)
	revoked := kr.add(t, "acme-old", acmeT, "agent", true)
	second := kr.add(t, "acme-agent-2", acmeT, "agent", false)
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		e := startSecure(t, rdb, kr.creds(t, ""), server.Config{}, ledger.Options{}, nil)
		id := "S8-" + randomHex(4) + ":refund"
		params := mustStruct(t, map[string]any{"amount": 100})

		// The same operation id from two tenants: two records.
		a, err := e.c.Reserve(as(acme), reserveReq(id, "payments.refund", params, newHolder()))
		if err != nil || a.Decision != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("acme Reserve = %v, %v", a, err)
		}
		// Tokens start at the store's clock in ms: a millisecond apart, the
		// two records' tokens differ, so acme's token is not globex's.
		time.Sleep(2 * time.Millisecond)
		g, err := e.c.Reserve(as(globex), reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 999}), newHolder()))
		if err != nil || g.Decision != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("globex Reserve of the same id = %v, %v; want its own EXECUTE", g, err)
		}
		if g.Operation.FencingToken == a.Operation.FencingToken {
			t.Fatalf("both tenants' records hold token %d", a.Operation.FencingToken)
		}
		if _, err := e.c.Complete(as(acme), &ledgerv1.CompleteRequest{OperationId: id, FencingToken: a.Operation.FencingToken,
			Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: "acme-refund"}}); err != nil {
			t.Fatal(err)
		}
		// globex sees its own record, never acme's result.
		if got, err := e.c.Lookup(as(globex), &ledgerv1.LookupRequest{OperationId: id}); err != nil || got.Operation.State != ledgerv1.State_STATE_RUNNING || got.Operation.Result != nil {
			t.Fatalf("globex Lookup = %v, %v", got, err)
		}
		// A globex worker cannot complete acme's operation with acme's token.
		_, err = e.c.Complete(as(globex), &ledgerv1.CompleteRequest{OperationId: id, FencingToken: a.Operation.FencingToken, Outcome: ledgerv1.Outcome_OUTCOME_FAILED_FINAL})
		wantReason(t, err, codes.FailedPrecondition, "STALE_FENCING_TOKEN")
		if got, _ := e.c.Lookup(as(acme), &ledgerv1.LookupRequest{OperationId: id}); got.GetOperation().GetResult().GetResourceId() != "acme-refund" {
			t.Fatalf("acme's record changed: %v", got)
		}
		// globex's reconciler lists globex's unresolved operation only, and
		// reconciling does not reach acme's.
		list, err := e.c.ListUnresolved(as(globexRec), &ledgerv1.ListUnresolvedRequest{States: []ledgerv1.State{ledgerv1.State_STATE_PENDING, ledgerv1.State_STATE_UNKNOWN}})
		if err != nil || len(list.Operations) != 0 {
			t.Fatalf("globex list = %v, %v", list, err)
		}
		_, err = e.c.Reconcile(as(globexRec), &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_ABANDON})
		wantReason(t, err, codes.FailedPrecondition, "OPERATION_IN_PROGRESS")
		if list, err := e.c.ListUnresolved(as(acmeRec), &ledgerv1.ListUnresolvedRequest{}); err != nil || len(list.Operations) != 0 {
			t.Fatalf("acme list = %v, %v", list, err)
		}

		// Callers without valid credentials are refused and change nothing.
		for name, ctx := range map[string]context.Context{
			"no credentials": context.Background(),
			"wrong secret":   as("acme-agent." + strings.Repeat("0", 64)),
			"unknown key":    as("nobody." + strings.Repeat("0", 64)),
			"revoked key":    as(revoked),
			"not a key":      as("garbage"),
			"basic auth":     metadata.AppendToOutgoingContext(context.Background(), "authorization", "Basic "+acme),
		} {
			_, err := e.c.Reserve(ctx, reserveReq(id+"-"+name, "payments.refund", params, newHolder()))
			wantReason(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
			if _, err := e.c.Lookup(as(acme), &ledgerv1.LookupRequest{OperationId: id + "-" + name}); codeOf(err) != codes.NotFound {
				t.Fatalf("%s: a refused Reserve wrote a record (%v)", name, err)
			}
		}
		// Scopes.
		_, err = e.c.Reconcile(as(acme), &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_APPLIED})
		wantReason(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
		_, err = e.c.ListUnresolved(as(acme), &ledgerv1.ListUnresolvedRequest{})
		wantReason(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
		_, err = e.c.Reserve(as(acmeView), reserveReq(id+"-viewer", "payments.refund", params, newHolder()))
		wantReason(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
		if _, err := e.c.Lookup(as(acmeView), &ledgerv1.LookupRequest{OperationId: id}); err != nil {
			t.Fatalf("viewer Lookup: %v", err)
		}
		if _, err := e.c.Reserve(as(acmeRec), reserveReq(id+"-rec", "payments.refund", params, newHolder())); err != nil {
			t.Fatalf("reconciler Reserve: %v", err)
		}
		// Another permit under one tenant, with a second key of the tenant.
		other := reserveReq(id, "payments.refund", params, newHolder())
		other.PermitId = "permit-2"
		_, err = e.c.Reserve(as(second), other)
		if ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED"); ei.Metadata["differs"] != "permit" {
			t.Fatalf("differs = %q", ei.Metadata["differs"])
		}
		// Replays under the tenant's second key.
		if r, err := e.c.Reserve(as(second), reserveReq(id, "payments.refund", params, newHolder())); err != nil || r.Decision != ledgerv1.Decision_DECISION_REPLAY {
			t.Fatalf("second key = %v, %v", r, err)
		}
		// Health stays open; reflection needs credentials.
		if r, err := grpc_health_v1.NewHealthClient(e.conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{}); err != nil || r.Status != grpc_health_v1.HealthCheckResponse_SERVING {
			t.Fatalf("health without credentials = %v, %v", r, err)
		}
		if err := listServices(context.Background(), e.conn); codeOf(err) != codes.Unauthenticated {
			t.Fatalf("reflection without credentials = %v", err)
		}
		if err := listServices(as(acmeView), e.conn); err != nil {
			t.Fatalf("reflection with credentials = %v", err)
		}

		// Revoking a key by reloading the file: the next call is refused,
		// the connection stays up for the tenant's other key.
		kr2 := *kr
		kr2.lines = append([]string(nil), kr.lines...)
		for i, l := range kr2.lines {
			if strings.Contains(l, "id: acme-agent-2,") {
				kr2.lines[i] = strings.Replace(l, "disabled: false", "disabled: true", 1)
			}
		}
		e.auth.Reload(kr2.creds(t, ""))
		_, err = e.c.Lookup(as(second), &ledgerv1.LookupRequest{OperationId: id})
		wantReason(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
		if _, err := e.c.Lookup(as(acme), &ledgerv1.LookupRequest{OperationId: id}); err != nil {
			t.Fatalf("the other key after the reload: %v", err)
		}
	})
}

func listServices(ctx context.Context, conn *grpc.ClientConn) error {
	stream, err := grpc_reflection_v1.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return err
	}
	// Send reports io.EOF when the server has already ended the stream (a
	// refusal can beat the request); the status is then Recv's.
	if err := stream.Send(&grpc_reflection_v1.ServerReflectionRequest{MessageRequest: &grpc_reflection_v1.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = stream.Recv()
	_ = stream.CloseSend()
	return err
}

func TestPublicReflection(t *testing.T) {
	kr := newKeyring(t)
	kr.add(t, "a", "acme", "agent", false)
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{PublicReflection: true}, ledger.Options{}, nil)
	if err := listServices(context.Background(), e.conn); err != nil {
		t.Fatalf("public reflection = %v", err)
	}
	_, err := e.c.Lookup(context.Background(), &ledgerv1.LookupRequest{OperationId: "x"})
	wantReason(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
}

func TestRateLimitPerTenant(t *testing.T) {
	kr := newKeyring(t)
	acme := kr.add(t, "acme", "acme", "agent", false)
	globex := kr.add(t, "globex", "globex", "agent", false)
	vip := kr.add(t, "vip", "vip", "agent", false)
	creds := kr.creds(t, "tenants:\n  vip: {rate: 1000, burst: 50}\n")
	e := startSecure(t, redistest.Shared(t).Client(t), creds, server.Config{Rate: 0.5, Burst: 2}, ledger.Options{}, nil)
	lookup := func(key string) error {
		_, err := e.c.Lookup(as(key), &ledgerv1.LookupRequest{OperationId: "rate-" + randomHex(4)})
		if codeOf(err) == codes.NotFound {
			return nil
		}
		return err
	}
	for i := range 2 {
		if err := lookup(acme); err != nil {
			t.Fatalf("call %d within the burst: %v", i+1, err)
		}
	}
	err := lookup(acme)
	wantReason(t, err, codes.ResourceExhausted, "RATE_LIMITED")
	if !hasRetryInfo(err) {
		t.Fatal("RATE_LIMITED without RetryInfo")
	}
	// Another tenant has its own bucket, and one tenant may have a larger one.
	if err := lookup(globex); err != nil {
		t.Fatalf("globex: %v", err)
	}
	for i := range 20 {
		if err := lookup(vip); err != nil {
			t.Fatalf("vip call %d: %v", i+1, err)
		}
	}
	// A reloaded credentials file's limits apply at once to a tenant whose
	// bucket exists already: it gets a full bucket at them.
	e.auth.Reload(kr.creds(t, "tenants:\n  acme: {rate: 1000, burst: 50}\n"))
	for i := range 20 {
		if err := lookup(acme); err != nil {
			t.Fatalf("acme call %d after its limits were raised: %v", i+1, err)
		}
	}
	e.auth.Reload(kr.creds(t, "tenants:\n  acme: {rate: 0.01, burst: 1}\n"))
	if err := lookup(acme); err != nil {
		t.Fatalf("acme's first call after its limits were lowered: %v", err)
	}
	wantReason(t, lookup(acme), codes.ResourceExhausted, "RATE_LIMITED")
}

// TestTenantLimitsFallBackFieldByField: a limit a tenant's entry leaves at
// zero is the service-wide one, each on its own, and a burst set nowhere is
// the rate rounded up. Each case makes calls in quick succession (far
// quicker than a token comes back) and counts the refused ones.
func TestTenantLimitsFallBackFieldByField(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     server.Config
		tenant  string // the tenant's entry in the credentials file
		calls   int
		refused int
	}{
		{"own rate, no burst anywhere: the rate rounded up", server.Config{}, "{rate: 100}", 20, 0},
		{"own rate, no burst anywhere, fractional", server.Config{}, "{rate: 1.5}", 4, 2},
		{"own rate, the service's burst", server.Config{Rate: 0.01, Burst: 3}, "{rate: 2}", 5, 2},
		{"own burst, the service's rate", server.Config{Rate: 0.01, Burst: 2}, "{burst: 50}", 10, 0},
		{"own burst of 4, the service's rate", server.Config{Rate: 0.01, Burst: 2}, "{burst: 4}", 6, 2},
		{"no entry: the service's rate rounded up", server.Config{Rate: 1.5}, "{max_unresolved: 10}", 4, 2},
		{"both its own", server.Config{Rate: 0.01, Burst: 1}, "{rate: 2, burst: 3}", 5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kr := newKeyring(t)
			key := kr.add(t, "k", "t1", "agent", false)
			e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, "tenants:\n  t1: "+tc.tenant+"\n"), tc.cfg, ledger.Options{}, nil)
			refused := 0
			for range tc.calls {
				_, err := e.c.Lookup(as(key), &ledgerv1.LookupRequest{OperationId: "rate-" + randomHex(4)})
				switch codeOf(err) {
				case codes.NotFound:
				case codes.ResourceExhausted:
					refused++
				default:
					t.Fatal(err)
				}
			}
			if refused != tc.refused {
				t.Fatalf("%d of %d calls refused, want %d", refused, tc.calls, tc.refused)
			}
		})
	}
}

// TestCredentialsRefuseBadLimits: a tenant's limit that is negative, or a
// rate that is not a finite number, makes the credentials file invalid.
func TestCredentialsRefuseBadLimits(t *testing.T) {
	kr := newKeyring(t)
	kr.add(t, "k", "t1", "agent", false)
	for _, limits := range []string{"{rate: -1}", "{rate: .nan}", "{rate: .inf}", "{rate: -.inf}", "{burst: -1}", "{max_unresolved: -1}"} {
		if _, err := server.ParseCredentials([]byte(kr.doc("tenants:\n  t1: " + limits + "\n"))); err == nil || !strings.Contains(err.Error(), "t1") {
			t.Errorf("%s: %v, want an error about tenant t1", limits, err)
		}
	}
	if _, err := server.ParseCredentials([]byte(kr.doc("tenants:\n  t1: {rate: 0.5, burst: 2, max_unresolved: 10}\n"))); err != nil {
		t.Fatal(err)
	}
	// Of several bad tenants, the first by name, whatever the map's order.
	for range 20 {
		doc := kr.doc("tenants:\n  t3: {burst: -1}\n  t1: {rate: -1}\n  t2: {max_unresolved: -1}\n")
		if _, err := server.ParseCredentials([]byte(doc)); err == nil || !strings.Contains(err.Error(), `tenants["t1"]: rate`) {
			t.Fatalf("three bad tenants: %v, want the error about t1's rate", err)
		}
	}
	// A name YAML reads as null would have its entry dropped, and the
	// tenant its limits, with no error: quoted, it is the name.
	for _, name := range []string{"null", "Null", "NULL", "~"} {
		if _, err := server.ParseCredentials([]byte(kr.doc("tenants:\n  " + name + ": {rate: 5}\n"))); err == nil || !strings.Contains(err.Error(), "quote it") {
			t.Errorf("tenant %s: %v, want an error asking to quote it", name, err)
		}
		c, err := server.ParseCredentials([]byte(kr.doc("tenants:\n  \"" + name + "\": {rate: 5}\n")))
		if err != nil || c.Limits(name).Rate != 5 {
			t.Errorf("tenant %q quoted: %v", name, err)
		}
		// The same name reaching the map through a merge key (<<), in
		// place, from an anchor, or in a mapping merged into a merged one.
		for _, merged := range []string{
			"tenants:\n  <<: {" + name + ": {rate: 5}}\n",
			"tenants:\n  t1: &l {rate: 5}\n  <<: [{t2: *l}, {" + name + ": *l}]\n",
			"tenants:\n  <<: {<<: {" + name + ": {rate: 5}}, t2: {rate: 1}}\n",
		} {
			if _, err := server.ParseCredentials([]byte(kr.doc(merged))); err == nil || !strings.Contains(err.Error(), `the name "`+name+`" reads as YAML's null`) {
				t.Errorf("%q: %v, want an error naming the null and asking to quote it", merged, err)
			}
			quoted := strings.Replace(merged, name+":", `"`+name+`":`, 1)
			if c, err := server.ParseCredentials([]byte(kr.doc(quoted))); err != nil || c.Limits(name).Rate != 5 {
				t.Errorf("%q: %v, want tenant %q's limits", quoted, err, name)
			}
		}
		// The name written as an alias (*n) of such a null: the error
		// names the null, not the anchor.
		aliased := "tenants:\n  t1: {rate: 5, burst: &n " + name + "}\n  *n : {rate: 5}\n"
		if _, err := server.ParseCredentials([]byte(kr.doc(aliased))); err == nil || !strings.Contains(err.Error(), `the name "`+name+`" reads as YAML's null`) {
			t.Errorf("%q: %v, want an error naming the null and asking to quote it", aliased, err)
		}
	}
}

// TestCredentialsNullTenant: a key's or client's tenant that YAML reads as
// null (null, Null, NULL, ~, JSON's null) decodes as no tenant; the file is
// refused with an error that names the null value and asks to quote it,
// rather than one saying the tenant is missing. Quoted, it is the name.
func TestCredentialsNullTenant(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	for _, name := range []string{"null", "Null", "NULL", "~"} {
		for _, doc := range []string{
			"keys:\n  - {id: k1, tenant: " + name + ", scopes: [agent], secret_sha256: " + hash + "}\n",
			"keys:\n  - id: k1\n    tenant: " + name + "\n    scopes: [agent]\n    secret_sha256: " + hash + "\n",
		} {
			_, err := server.ParseCredentials([]byte(doc))
			if err == nil || !strings.Contains(err.Error(), "keys[0] (k1): tenant") || !strings.Contains(err.Error(), `"`+name+`" reads as YAML's null`) ||
				!strings.Contains(err.Error(), "quote it") {
				t.Errorf("%q: %v, want an error naming the null tenant and asking to quote it", doc, err)
			}
			if _, err := server.ParseCredentials([]byte(strings.Replace(doc, "tenant: "+name, `tenant: "`+name+`"`, 1))); err != nil {
				t.Errorf("tenant %q quoted: %v", name, err)
			}
		}
		doc := "clients:\n  - {common_name: c1, tenant: " + name + ", scopes: [agent]}\n"
		if _, err := server.ParseCredentials([]byte(doc)); err == nil || !strings.Contains(err.Error(), "clients[0]: tenant") ||
			!strings.Contains(err.Error(), `"`+name+`" reads as YAML's null`) {
			t.Errorf("%q: %v, want an error naming the null tenant", doc, err)
		}
	}
	doc := `{"keys": [{"id": "k1", "tenant": null, "scopes": ["agent"], "secret_sha256": "` + hash + `"}]}`
	if _, err := server.ParseCredentials([]byte(doc)); err == nil || !strings.Contains(err.Error(), `"null" reads as YAML's null`) {
		t.Errorf("JSON null tenant: %v", err)
	}
	// A tenant left empty is missing, as one left out.
	for _, doc := range []string{
		"keys:\n  - {id: k1, tenant: , scopes: [agent], secret_sha256: " + hash + "}\n",
		"keys:\n  - {id: k1, scopes: [agent], secret_sha256: " + hash + "}\n",
	} {
		if _, err := server.ParseCredentials([]byte(doc)); err == nil || !strings.Contains(err.Error(), "required") || strings.Contains(err.Error(), "null") {
			t.Errorf("%q: %v, want an error saying the tenant is required", doc, err)
		}
	}
}

// TestCredentialsNullTenantThroughMergeKey: a tenant that YAML reads as
// null reaches a key or client through a merge key (<<) as well: from an
// anchored mapping, a mapping written in place, the first mapping of a
// list that has a tenant, or a mapping merged into the merged one. The file is refused with the same error as a
// tenant written as null in the entry itself, naming the null value. A
// tenant the entry sets itself, or one an earlier merged mapping sets, is
// the one decoding keeps, and no null is reported then.
func TestCredentialsNullTenantThroughMergeKey(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	for _, name := range []string{"null", "Null", "NULL", "~"} {
		// keys[0] sets its own tenant over the anchored null; keys[1] takes
		// the null from the anchor.
		anchored := "keys:\n" +
			"  - <<: &base {tenant: " + name + ", scopes: [agent]}\n    id: k0\n    tenant: acme\n    secret_sha256: " + hash + "\n" +
			"  - <<: *base\n    id: k1\n    secret_sha256: " + hash + "\n"
		for _, tc := range []struct{ doc, where string }{
			{anchored, "keys[1] (k1): tenant"},
			{"keys:\n  - {<<: {tenant: " + name + "}, id: k1, scopes: [agent], secret_sha256: " + hash + "}\n", "keys[0] (k1): tenant"},
			{"keys:\n  - {<<: [{scopes: [agent]}, {tenant: " + name + "}, {tenant: acme}], id: k1, secret_sha256: " + hash + "}\n", "keys[0] (k1): tenant"},
			{"keys:\n  - {<<: {<<: {tenant: " + name + "}, scopes: [agent]}, id: k1, secret_sha256: " + hash + "}\n", "keys[0] (k1): tenant"},
			{"clients:\n  - {<<: &c {tenant: " + name + "}, common_name: c0, tenant: acme, scopes: [agent]}\n" +
				"  - {<<: *c, common_name: c1, scopes: [agent]}\n", "clients[1]: tenant"},
		} {
			_, err := server.ParseCredentials([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.where) || !strings.Contains(err.Error(), `"`+name+`" reads as YAML's null`) ||
				!strings.Contains(err.Error(), "quote it") {
				t.Errorf("%q: %v, want an error naming %s's null tenant and asking to quote it", tc.doc, err, tc.where)
			}
			quoted := strings.NewReplacer("tenant: "+name+"}", `tenant: "`+name+`"}`, "tenant: "+name+",", `tenant: "`+name+`",`).Replace(tc.doc)
			if _, err := server.ParseCredentials([]byte(quoted)); err != nil {
				t.Errorf("tenant %q quoted: %v", name, err)
			}
		}
		// The tenant decoding keeps is not the null but acme (accepted: a
		// key's tenant is never empty): the entry's own, or an earlier
		// merged mapping's.
		for _, doc := range []string{
			"keys:\n  - {<<: {tenant: " + name + "}, id: k1, tenant: acme, scopes: [agent], secret_sha256: " + hash + "}\n",
			"keys:\n  - {<<: [{tenant: acme}, {tenant: " + name + "}], id: k1, scopes: [agent], secret_sha256: " + hash + "}\n",
			"keys:\n  - {<<: {<<: {tenant: " + name + "}, tenant: acme}, id: k1, scopes: [agent], secret_sha256: " + hash + "}\n",
		} {
			if _, err := server.ParseCredentials([]byte(doc)); err != nil {
				t.Errorf("%q: %v", doc, err)
			}
		}
	}
	// A tenant left empty in the merged mapping is missing, as one left out.
	doc := "keys:\n  - {<<: {tenant: }, id: k1, scopes: [agent], secret_sha256: " + hash + "}\n"
	if _, err := server.ParseCredentials([]byte(doc)); err == nil || !strings.Contains(err.Error(), "required") || strings.Contains(err.Error(), "null") {
		t.Errorf("%q: %v, want an error saying the tenant is required", doc, err)
	}
}

// TestCredentialsRefuseNullKeys: decoding drops without a word every entry
// whose key YAML reads as null (null, Null, NULL, ~, a key left empty), in
// a tenant's limits, a key's or client's entry, the top level, or a mapping
// merged into one (<<), also where the key is an alias (*n) of a null: the
// file is refused, with the line of the key and the entry it is in, never
// loaded without it.
func TestCredentialsRefuseNullKeys(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	for _, name := range []string{"null", "Null", "NULL", "~"} {
		for _, tc := range []struct{ doc, where string }{
			{"tenants: {a: {rate: 5, " + name + ": 3}}\n", `line 1: tenants["a"]: the key "` + name + `"`},
			{"tenants:\n  a:\n    rate: 5\n    " + name + ": 3\n", `line 4: tenants["a"]: the key "` + name + `"`},
			{"keys:\n  - id: k1\n    tenant: acme\n    " + name + ": x\n    scopes: [agent]\n    secret_sha256: " + hash + "\n", `line 4: keys[0]: the key "` + name + `"`},
			{"clients:\n  - {common_name: c0, tenant: acme, scopes: [agent]}\n  - {common_name: c1, " + name + ": x, tenant: acme, scopes: [agent]}\n", `line 3: clients[1]: the key "` + name + `"`},
			{"keys: []\n" + name + ": {keys: []}\n", `line 2: the top level: the key "` + name + `"`},
			{"keys:\n  - {<<: {" + name + ": x}, id: k1, tenant: acme, scopes: [agent], secret_sha256: " + hash + "}\n", `line 2: keys[0]: the key "` + name + `"`},
			{"tenants:\n  t1: {rate: 5, burst: &n " + name + "}\n  t2: {rate: 5, *n : 3}\n", `line 3: tenants["t2"]: the key "` + name + `"`},
			// A quoted << is a name, not a merge key: the mapping under it
			// is the tenant's limits, whose null key is refused.
			{"tenants:\n  \"<<\": {" + name + ": {rate: 5}}\n", `line 2: tenants["<<"]: the key "` + name + `"`},
		} {
			_, err := server.ParseCredentials([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.where+" reads as YAML's null") {
				t.Errorf("%q: %v, want an error with %q", tc.doc, err, tc.where)
			}
		}
	}
	// A key left empty, or tagged as null, is null as well.
	for _, doc := range []string{
		"tenants: {a: {rate: 5, ? : 3}}\n",
		"keys:\n  - {id: k1, ? !!null '' : x, tenant: acme, scopes: [agent], secret_sha256: " + hash + "}\n",
	} {
		if _, err := server.ParseCredentials([]byte(doc)); err == nil || !strings.Contains(err.Error(), "reads as YAML's null") {
			t.Errorf("%q: %v, want an error about the null key", doc, err)
		}
	}
	// Quoted, << under tenants is a tenant named "<<", as "null" quoted is
	// one named null: a name a key's tenant may have too.
	c, err := server.ParseCredentials([]byte("keys:\n  - {id: k1, tenant: \"<<\", scopes: [agent], secret_sha256: " + hash + "}\ntenants:\n  \"<<\": {rate: 5}\n"))
	if err != nil || c.Limits("<<").Rate != 5 {
		t.Errorf("tenant \"<<\": %v", err)
	}
}

// TestCredentialsNullTenantUnderAliasedKey: a key's tenant field written
// as an alias (*t) of the string tenant is its tenant field; a null there
// is named as such, not reported as a tenant left out.
func TestCredentialsNullTenantUnderAliasedKey(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	doc := "clients:\n  - {common_name: &t tenant, tenant: acme, scopes: [agent]}\n" +
		"keys:\n  - {id: k1, *t : ~, scopes: [agent], secret_sha256: " + hash + "}\n"
	if _, err := server.ParseCredentials([]byte(doc)); err == nil || !strings.Contains(err.Error(), `keys[0] (k1): tenant "~" reads as YAML's null`) {
		t.Errorf("%q: %v, want an error naming the null tenant", doc, err)
	}
}

// TestCredentialsFileIsOneDocument: what follows the credentials document
// (a second document revoking a key, or text that is not YAML) makes the
// file invalid instead of going unread.
func TestCredentialsFileIsOneDocument(t *testing.T) {
	kr := newKeyring(t)
	kr.add(t, "k", "t1", "agent", false)
	revoked := strings.Replace(kr.doc(""), "disabled: false", "disabled: true", 1)
	for _, doc := range []string{kr.doc("---\n" + revoked), kr.doc("---\n"), "{}00", "keys: []\n...\n: :\n"} {
		if _, err := server.ParseCredentials([]byte(doc)); err == nil || !strings.Contains(err.Error(), "exactly one YAML document") {
			t.Errorf("%q: %v, want an error about the second document", doc, err)
		}
	}
	if _, err := server.ParseCredentials([]byte("---\n" + kr.doc("...\n"))); err != nil {
		t.Fatal(err)
	}
	// An empty file (a truncated copy, the wrong path templated in) says so.
	for _, doc := range []string{"", "\n", "# only a comment\n"} {
		if _, err := server.ParseCredentials([]byte(doc)); err == nil || !strings.Contains(err.Error(), "the credentials file is empty") {
			t.Errorf("%q: %v, want an error saying the file is empty", doc, err)
		}
	}
}

// TestCredentialsErrorsQuoteNoSecret: a key written whole where its id
// belongs (as "ledgerd keygen" prints it, "<id>.<secret>") is refused
// without quoting its secret: the error goes to ledgerd's stderr, or to its
// log when a reload fails. It names the entry and the id.
func TestCredentialsErrorsQuoteNoSecret(t *testing.T) {
	key, hash, err := server.NewAPIKey("acme-agent-1")
	if err != nil {
		t.Fatal(err)
	}
	_, secret, _ := strings.Cut(key, ".")
	for _, doc := range []string{
		"keys:\n  - {id: " + key + ", tenant: acme, scopes: [agent], secret_sha256: " + hash + "}\n",
		"keys:\n  - {id: k0, tenant: acme, scopes: [agent], secret_sha256: " + hash + "}\n" +
			"  - {id: \"Bearer " + key + "\", tenant: acme, scopes: [agent], secret_sha256: " + hash + "}\n",
		`{"keys": [{"id": "` + key + `.", "tenant": "acme", "scopes": ["agent"], "secret_sha256": "` + hash + `"}]}`,
	} {
		_, err := server.ParseCredentials([]byte(doc))
		if err == nil {
			t.Fatalf("%q: accepted", doc)
		}
		if strings.Contains(err.Error(), secret[:8]) {
			t.Errorf("the error quotes the key's secret: %v", err)
		}
		if !strings.Contains(err.Error(), "keys[") || !strings.Contains(err.Error(), "acme-agent-1") {
			t.Errorf("%v: want the entry and the id named", err)
		}
	}
	// A file of the wrong shape is refused by line and kind, in the
	// file's terms: no Go type, and not the value (a key pasted there).
	for _, c := range []struct{ doc, want string }{
		{"keys: " + key + "\n", "not a valid credentials document: line 1: keys: text where a list belongs"},
		{"keys:\n  - {id: k1, tenant: acme, scope: [agent], secret_sha256: " + hash + "}\n", "not a valid credentials document: line 2: unknown field scope"},
	} {
		_, err := server.ParseCredentials([]byte(c.doc))
		if err == nil || err.Error() != c.want {
			t.Errorf("%q: %v, want %q", c.doc, err, c.want)
		}
	}
}

// TestCredentialsClientURIAsCompared: a client's uri is compared with a
// certificate's URI as url.URL.String writes it, so one spelled otherwise
// (an upper-case scheme, a space) would match no certificate: the file is
// refused with the spelling to use.
func TestCredentialsClientURIAsCompared(t *testing.T) {
	for uri, want := range map[string]string{
		"SPIFFE://acme.example/agent": `write it as "spiffe://acme.example/agent"`,
		"spiffe://acme.example/a b":   `write it as "spiffe://acme.example/a%20b"`,
		"spiffe://acme example/agent": "not a URI",
		"spiffe://acme.example/%zz":   "not a URI",
	} {
		doc := "clients:\n  - {uri: \"" + uri + "\", tenant: acme, scopes: [agent]}\n"
		if _, err := server.ParseCredentials([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("uri %q: %v, want an error with %q", uri, err, want)
		}
	}
	if _, err := server.ParseCredentials([]byte("clients:\n  - {uri: \"spiffe://acme.example/agent\", tenant: acme, scopes: [agent]}\n")); err != nil {
		t.Fatal(err)
	}
}

func TestUnresolvedLimitOverTheWire(t *testing.T) {
	kr := newKeyring(t)
	key := kr.add(t, "small", "small", "agent", false)
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{},
		ledger.Options{UnresolvedLimit: func(string) int { return ledger.NumShards }}, nil)
	prefix := "quota-" + randomHex(4) + "-"
	for i := 0; i < 10*ledger.NumShards; i++ {
		_, err := e.c.Reserve(as(key), reserveReq(fmt.Sprint(prefix, i), "payments.refund", nil, newHolder()))
		if err == nil {
			continue
		}
		wantReason(t, err, codes.ResourceExhausted, "UNRESOLVED_LIMIT")
		return
	}
	t.Fatal("the tenant was never limited")
}

// rawCodec sends bytes as they are, to put what a proto library would refuse
// on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

func TestUndecodableRequestsAreInvalidArgument(t *testing.T) {
	kr := newKeyring(t)
	// A tenant of its own: the ids below are fixed, and a rerun (-count)
	// shares the Redis.
	key := kr.add(t, "a", "acme-"+randomHex(4), "agent", false)
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{MaxRequestBytes: 4 << 10}, ledger.Options{}, nil)
	var badUTF8 []byte
	badUTF8 = protowire.AppendTag(badUTF8, 1, protowire.BytesType)
	badUTF8 = protowire.AppendBytes(badUTF8, []byte("op-\xff\xfe"))
	badUTF8 = protowire.AppendTag(badUTF8, 2, protowire.BytesType)
	badUTF8 = protowire.AppendBytes(badUTF8, []byte("payments.refund"))
	var huge []byte
	huge = protowire.AppendTag(huge, 1, protowire.BytesType)
	huge = protowire.AppendBytes(huge, []byte(strings.Repeat("k", 8<<10)))
	// params, which the codec leaves encoded for the handler: a key not
	// UTF-8, and bytes no Struct has.
	var badParams, garbageParams []byte
	badParams = protowire.AppendTag(badParams, 1, protowire.BytesType)
	badParams = protowire.AppendBytes(badParams, []byte("undecodable-params-1"))
	badParams = protowire.AppendTag(badParams, 2, protowire.BytesType)
	badParams = protowire.AppendBytes(badParams, []byte("payments.refund"))
	badParams = protowire.AppendTag(badParams, 7, protowire.BytesType)
	badParams = protowire.AppendBytes(badParams, []byte("h"))
	badParams = protowire.AppendTag(badParams, 3, protowire.BytesType)
	badParams = protowire.AppendBytes(badParams, protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType),
		protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte("k\xff"))))
	garbageParams = protowire.AppendTag(garbageParams, 1, protowire.BytesType)
	garbageParams = protowire.AppendBytes(garbageParams, []byte("undecodable-params-2"))
	garbageParams = protowire.AppendTag(garbageParams, 2, protowire.BytesType)
	garbageParams = protowire.AppendBytes(garbageParams, []byte("payments.refund"))
	garbageParams = protowire.AppendTag(garbageParams, 7, protowire.BytesType)
	garbageParams = protowire.AppendBytes(garbageParams, []byte("h"))
	garbageParams = protowire.AppendTag(garbageParams, 3, protowire.BytesType)
	garbageParams = protowire.AppendBytes(garbageParams, []byte{0xff, 0xff})
	// A Complete's result data, which the codec leaves encoded too: a key
	// not UTF-8, and bytes no Struct has, for a live claim.
	claim, err := e.c.Reserve(as(key), reserveReq("undecodable-result", "payments.refund", nil, newHolder()))
	if err != nil {
		t.Fatal(err)
	}
	completeWith := func(data []byte) []byte {
		b := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte("undecodable-result"))
		b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.VarintType), claim.GetOperation().GetFencingToken())
		b = protowire.AppendVarint(protowire.AppendTag(b, 3, protowire.VarintType), uint64(ledgerv1.Outcome_OUTCOME_SUCCEEDED))
		return protowire.AppendBytes(protowire.AppendTag(b, 4, protowire.BytesType), protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), data))
	}
	for _, c := range []struct {
		name, method string
		msg          []byte
	}{
		{"invalid UTF-8", "Reserve", badUTF8}, {"oversized", "Reserve", huge}, {"garbage", "Reserve", []byte{0xff, 0xff, 0xff}},
		{"params not UTF-8", "Reserve", badParams}, {"params garbage", "Reserve", garbageParams},
		{"result data not UTF-8", "Complete", completeWith(protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType),
			protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte("k\xff"))))},
		{"result data garbage", "Complete", completeWith([]byte{0xff, 0xff})},
	} {
		var reply []byte
		err := e.conn.Invoke(as(key), "/ledger.v1.LedgerService/"+c.method, &c.msg, &reply, grpc.ForceCodecV2(nil), grpc.ForceCodec(rawCodec{}))
		code, ei, br := errorInfo(t, err)
		if code != codes.InvalidArgument || ei.Reason != "INVALID_ARGUMENT" || br == nil || br.FieldViolations[0].Field != "request" {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	for _, id := range []string{"undecodable-params-1", "undecodable-params-2"} {
		_, err := e.c.Lookup(as(key), &ledgerv1.LookupRequest{OperationId: id})
		wantReason(t, err, codes.NotFound, "NOT_FOUND")
	}
	got, err := e.c.Lookup(as(key), &ledgerv1.LookupRequest{OperationId: "undecodable-result"})
	if err != nil || got.GetOperation().GetState() != ledgerv1.State_STATE_RUNNING || got.GetOperation().GetResult() != nil {
		t.Fatalf("after the undecodable Completes: %v, %v", got.GetOperation(), err)
	}
}

// TestUndecodableRequestsGoThroughTheChain: a request that does not decode
// still meets authentication first, then the scope and the tenant's rate,
// and writes its call log line (the second call refused for its
// credentials within 10 s writes none: TestRefusedCallsLoggedAtMostEveryInterval);
// only a caller allowed to make the call learns that the request was
// invalid.
func TestUndecodableRequestsGoThroughTheChain(t *testing.T) {
	kr := newKeyring(t)
	key := kr.add(t, "a", "acme", "agent", false)
	viewer := kr.add(t, "v", "acme", "viewer", false)
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{Rate: 0.01, Burst: 1}, ledger.Options{}, nil)
	garbage := []byte{0xff, 0xff, 0xff}
	call := func(ctx context.Context) error {
		var reply []byte
		return e.conn.Invoke(ctx, "/ledger.v1.LedgerService/Reserve", &garbage, &reply, grpc.ForceCodecV2(nil), grpc.ForceCodec(rawCodec{}))
	}
	wantReason(t, call(context.Background()), codes.Unauthenticated, "UNAUTHENTICATED")
	wantReason(t, call(as("a."+strings.Repeat("0", 64))), codes.Unauthenticated, "UNAUTHENTICATED")
	wantReason(t, call(as(viewer)), codes.PermissionDenied, "PERMISSION_DENIED")
	err := call(as(key))
	if c, ei, br := errorInfo(t, err); c != codes.InvalidArgument || ei.Reason != "INVALID_ARGUMENT" || br == nil || br.FieldViolations[0].Field != "request" {
		t.Fatalf("garbage with credentials: %v", err)
	}
	wantReason(t, call(as(key)), codes.ResourceExhausted, "RATE_LIMITED")
	var got []string
	for _, l := range finishedCalls(t, e.logs.String()) {
		if l.fields["grpc.method"] == "Reserve" {
			got = append(got, fmt.Sprint(l.fields["grpc.code"]))
		}
	}
	want := []string{"Unauthenticated", "PermissionDenied", "InvalidArgument", "ResourceExhausted"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("call log codes %v, want %v:\n%s", got, want, e.logs.String())
	}
}

// testPKI is a CA with a server and two client certificates.
type testPKI struct {
	pool               *x509.CertPool
	server, mapped, st tls.Certificate
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	ca := ledgertest.NewPKI(t, t.TempDir())
	p := &testPKI{pool: ca.Pool}
	p.server, _, _ = ca.Issue(t, "server", "ledger", true)
	p.mapped, _, _ = ca.Issue(t, "mapped", "agent-1.acme.internal", false)
	p.st, _, _ = ca.Issue(t, "stranger", "stranger", false, "spiffe://other/x")
	return p
}

func TestMutualTLS(t *testing.T) {
	pki := newPKI(t)
	kr := newKeyring(t)
	key := kr.add(t, "globex", "globex", "viewer", false)
	creds := kr.creds(t, "clients:\n  - {common_name: agent-1.acme.internal, tenant: acme, scopes: [agent]}\n")
	serverTLS := &tls.Config{Certificates: []tls.Certificate{pki.server}, ClientCAs: pki.pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	dial := func(cert *tls.Certificate) grpc.DialOption {
		c := &tls.Config{RootCAs: pki.pool, MinVersion: tls.VersionTLS12}
		if cert != nil {
			c.Certificates = []tls.Certificate{*cert}
		}
		return grpc.WithTransportCredentials(credentials.NewTLS(c))
	}
	rdb := redistest.Shared(t).Client(t)
	id := "mtls-" + randomHex(4)
	mapped := startSecure(t, rdb, creds, server.Config{}, ledger.Options{}, []grpc.ServerOption{grpc.Creds(credentials.NewTLS(serverTLS))}, dial(&pki.mapped))
	r, err := mapped.c.Reserve(context.Background(), reserveReq(id, "payments.refund", nil, newHolder()))
	if err != nil || r.Decision != ledgerv1.Decision_DECISION_EXECUTE {
		t.Fatalf("Reserve with a mapped certificate = %v, %v", r, err)
	}
	look, err := mapped.c.Lookup(context.Background(), &ledgerv1.LookupRequest{OperationId: id})
	if err != nil || look.Operation.History[0].Principal != "cert:agent-1.acme.internal" {
		t.Fatalf("Lookup = %v, %v", look, err)
	}
	// The same operation is not globex's.
	bearer := startSecure(t, rdb, creds, server.Config{}, ledger.Options{}, []grpc.ServerOption{grpc.Creds(credentials.NewTLS(serverTLS))}, dial(nil))
	if _, err := bearer.c.Lookup(as(key), &ledgerv1.LookupRequest{OperationId: id}); codeOf(err) != codes.NotFound {
		t.Fatalf("another tenant's Lookup = %v", err)
	}
	_, err = bearer.c.Lookup(context.Background(), &ledgerv1.LookupRequest{OperationId: id})
	wantReason(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
	stranger := startSecure(t, rdb, creds, server.Config{}, ledger.Options{}, []grpc.ServerOption{grpc.Creds(credentials.NewTLS(serverTLS))}, dial(&pki.st))
	_, err = stranger.c.Lookup(context.Background(), &ledgerv1.LookupRequest{OperationId: id})
	wantReason(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
}

func TestLogsHoldNoSecretsParamsOrResults(t *testing.T) {
	kr := newKeyring(t)
	key := kr.add(t, "acme-agent", "acme", "agent", false)
	rec := kr.add(t, "acme-rec", "acme", "reconciler", false)
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{}, ledger.Options{}, nil)
	id := "logs-" + randomHex(4)
	params := mustStruct(t, map[string]any{"card": "4111-SECRET-PARAM", "memo": "PRIVATE-MEMO-77"})
	r, err := e.c.Reserve(as(key), reserveReq(id, "payments.charge", params, newHolder()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.MarkUnknown(as(key), &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: r.Operation.FencingToken, Reason: "timeout"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Reconcile(as(rec), &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_APPLIED,
		Result: &ledgerv1.Result{ResourceId: "ch_1", Data: mustStruct(t, map[string]any{"receipt": "RESULT-DATA-5521"})}}); err != nil {
		t.Fatal(err)
	}
	_, _ = e.c.Reserve(as(key), reserveReq(id, "payments.charge", mustStruct(t, map[string]any{"card": "OTHER-SECRET-CARD"}), newHolder()))
	_, _ = e.c.Lookup(as("acme-agent."+strings.Repeat("f", 64)), &ledgerv1.LookupRequest{OperationId: id})
	logs := e.logs.String()
	_, secret, _ := strings.Cut(key, ".")
	_, recSecret, _ := strings.Cut(rec, ".")
	sum := sha256.Sum256([]byte(secret))
	for _, s := range []string{"4111-SECRET-PARAM", "PRIVATE-MEMO-77", "RESULT-DATA-5521", "OTHER-SECRET-CARD", secret, recSecret, hex.EncodeToString(sum[:]), strings.Repeat("f", 64)} {
		if strings.Contains(logs, s) {
			t.Fatalf("the log holds %q", s)
		}
	}
	for _, s := range []string{id, `"ledger.tenant":"acme"`, `"ledger.principal":"acme-agent"`, "IDEMPOTENCY_KEY_REUSED", "Unauthenticated"} {
		if !strings.Contains(logs, s) {
			t.Fatalf("the log lacks %q:\n%s", s, logs)
		}
	}
}

// TestScopesOfEveryMethod: each scope of contract.md §8 may call its methods and
// no other, on every method of the service. An allowed call does what it
// does for any caller; a refused one is PERMISSION_DENIED and changes
// nothing.
func TestScopesOfEveryMethod(t *testing.T) {
	kr := newKeyring(t)
	tenant := "scopes-" + randomHex(4)
	keys := map[string]string{
		"agent":      kr.add(t, "scope-agent", tenant, "agent", false),
		"reconciler": kr.add(t, "scope-reconciler", tenant, "reconciler", false),
		"viewer":     kr.add(t, "scope-viewer", tenant, "viewer", false),
	}
	admin := as(keys["reconciler"]) // may call every method: sets up and looks
	allowed := map[string][]string{
		"agent":      {"Reserve", "Complete", "MarkUnknown", "Renew", "Lookup", "StartRun", "GetRun", "EndRun", "GetCaller"},
		"reconciler": {"Reserve", "Complete", "MarkUnknown", "Renew", "Lookup", "Reconcile", "ListUnresolved", "StartRun", "GetRun", "EndRun", "ListRuns", "GetCaller"},
		"viewer":     {"Lookup", "ListUnresolved", "GetRun", "ListRuns", "GetCaller"},
	}
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{}, ledger.Options{}, nil)
	params := mustStruct(t, map[string]any{"amount": 5})

	// Every method is called about an operation in a state where the call
	// succeeds when allowed: RUNNING (UNKNOWN for Reconcile), or none for
	// Reserve. The setup returns the claim's fencing token.
	setup := func(method, id string) uint64 {
		t.Helper()
		switch method {
		case "Reserve", "StartRun", "GetCaller":
			return 0
		case "GetRun", "EndRun":
			if _, err := e.c.StartRun(admin, &ledgerv1.StartRunRequest{RunId: id}); err != nil {
				t.Fatal(err)
			}
			return 0
		}
		r, err := e.c.Reserve(admin, reserveReq(id, "payments.refund", params, newHolder()))
		if err != nil || r.Decision != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("Reserve(%s) = %v, %v", id, r, err)
		}
		tok := r.Operation.FencingToken
		if method == "Reconcile" {
			if _, err := e.c.MarkUnknown(admin, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: tok}); err != nil {
				t.Fatal(err)
			}
		}
		return tok
	}
	methods := map[string]func(ctx context.Context, id string, tok uint64) error{
		"Reserve": func(ctx context.Context, id string, _ uint64) error {
			_, err := e.c.Reserve(ctx, reserveReq(id, "payments.refund", params, newHolder()))
			return err
		},
		"Complete": func(ctx context.Context, id string, tok uint64) error {
			_, err := e.c.Complete(ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok,
				Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: "R-1"}})
			return err
		},
		"MarkUnknown": func(ctx context.Context, id string, tok uint64) error {
			_, err := e.c.MarkUnknown(ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: tok, Reason: "timeout"})
			return err
		},
		"Renew": func(ctx context.Context, id string, tok uint64) error {
			time.Sleep(2 * time.Millisecond) // a Renew that went through would move the lease
			_, err := e.c.Renew(ctx, &ledgerv1.RenewRequest{OperationId: id, FencingToken: tok})
			return err
		},
		"Lookup": func(ctx context.Context, id string, _ uint64) error {
			_, err := e.c.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: id})
			return err
		},
		"Reconcile": func(ctx context.Context, id string, _ uint64) error {
			_, err := e.c.Reconcile(ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_NOT_APPLIED})
			return err
		},
		"ListUnresolved": func(ctx context.Context, _ string, _ uint64) error {
			_, err := e.c.ListUnresolved(ctx, &ledgerv1.ListUnresolvedRequest{})
			return err
		},
		"StartRun": func(ctx context.Context, id string, _ uint64) error {
			_, err := e.c.StartRun(ctx, &ledgerv1.StartRunRequest{RunId: id})
			return err
		},
		"GetRun": func(ctx context.Context, id string, _ uint64) error {
			_, err := e.c.GetRun(ctx, &ledgerv1.GetRunRequest{RunId: id})
			return err
		},
		"ListRuns": func(ctx context.Context, _ string, _ uint64) error {
			_, err := e.c.ListRuns(ctx, &ledgerv1.ListRunsRequest{})
			return err
		},
		"EndRun": func(ctx context.Context, id string, _ uint64) error {
			_, err := e.c.EndRun(ctx, &ledgerv1.EndRunRequest{RunId: id, State: ledgerv1.RunState_RUN_STATE_DONE})
			return err
		},
		// GetCaller answers with the key's own tenant, id and scope.
		"GetCaller": func(ctx context.Context, id string, _ uint64) error {
			r, err := e.c.GetCaller(ctx, &ledgerv1.GetCallerRequest{})
			scope := id[strings.LastIndexByte(id, ':')+1 : strings.LastIndexByte(id, '-')]
			if err == nil && (r.Tenant != tenant || r.Principal != "scope-"+scope || !slices.Equal(r.Scopes, []string{scope})) {
				return fmt.Errorf("GetCaller = %v", r)
			}
			return err
		},
	}
	for _, m := range ledgerv1.LedgerService_ServiceDesc.Methods {
		if methods[m.MethodName] == nil {
			t.Errorf("the test calls no %s", m.MethodName)
		}
	}
	// read returns what the method could change: the operation, or the run.
	read := func(method, id string) (proto.Message, error) {
		if strings.HasSuffix(method, "Run") {
			r, err := e.c.GetRun(admin, &ledgerv1.GetRunRequest{RunId: id})
			return r.GetRun(), err
		}
		o, err := e.c.Lookup(admin, &ledgerv1.LookupRequest{OperationId: id})
		return o.GetOperation(), err
	}
	for scope, key := range keys {
		for method, call := range methods {
			id := "scopes-" + randomHex(4) + ":" + scope + "-" + method
			tok := setup(method, id)
			before, _ := read(method, id)
			err := call(as(key), id, tok)
			if slices.Contains(allowed[scope], method) {
				if err != nil {
					t.Errorf("%s calling %s: %v, want it allowed", scope, method, err)
				}
				continue
			}
			wantReason(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
			after, lerr := read(method, id)
			if method == "Reserve" || method == "StartRun" {
				if codeOf(lerr) != codes.NotFound {
					t.Errorf("%s calling %s was refused but left a record: %v, %v", scope, method, after, lerr)
				}
				continue
			}
			if lerr != nil || !proto.Equal(before, after) {
				t.Errorf("%s calling %s was refused but changed the record:\nbefore %v\nafter  %v (%v)", scope, method, before, after, lerr)
			}
		}
	}
}

// TestTracesHoldNoSecretsParamsOrResults: contract.md §8: the spans of the calls
// (otelgrpc's, as ledgerd sets it up, with the ledger's attributes) carry
// the operation id, never a parameter, a result, a failure message or a
// credential.
func TestTracesHoldNoSecretsParamsOrResults(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	kr := newKeyring(t)
	key := kr.add(t, "trace-agent", "trace-"+randomHex(4), "agent", false)
	rec := kr.add(t, "trace-rec", "trace-"+randomHex(4), "reconciler", false)
	e := startSecure(t, redistest.Shared(t).Client(t), kr.creds(t, ""), server.Config{}, ledger.Options{},
		[]grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp)))})
	id := "traces-" + randomHex(4)
	params := mustStruct(t, map[string]any{"card": "4111-SECRET-PARAM", "memo": "PRIVATE-MEMO-77"})
	r, err := e.c.Reserve(as(key), reserveReq(id, "payments.charge", params, newHolder()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Complete(as(key), &ledgerv1.CompleteRequest{OperationId: id, FencingToken: r.Operation.FencingToken,
		Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: "RESOURCE-ID-31", Data: mustStruct(t, map[string]any{"receipt": "RESULT-DATA-5521"})}}); err != nil {
		t.Fatal(err)
	}
	_, _ = e.c.Reserve(as(key), reserveReq(id, "payments.charge", mustStruct(t, map[string]any{"card": "OTHER-SECRET-CARD"}), newHolder()))
	_, _ = e.c.Lookup(as(key), &ledgerv1.LookupRequest{OperationId: id})
	_, _ = e.c.Reconcile(as(rec), &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_ABANDON,
		Failure: &ledgerv1.Failure{Code: "x", Message: "FAILURE-MESSAGE-88"}})
	_, _ = e.c.Lookup(as("trace-agent."+strings.Repeat("f", 64)), &ledgerv1.LookupRequest{OperationId: id})

	// The server ends a span after the reply is sent: wait for all six.
	var spans tracetest.SpanStubs
	for deadline := time.Now().Add(10 * time.Second); ; {
		if spans = exp.GetSpans(); len(spans) >= 6 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(spans) < 6 {
		t.Fatalf("%d spans, want 6", len(spans))
	}
	var text strings.Builder
	for _, sp := range spans {
		fmt.Fprintln(&text, sp.Name, sp.Status.Description)
		for _, a := range sp.Attributes {
			fmt.Fprintln(&text, a.Key, a.Value.String())
		}
		for _, ev := range sp.Events {
			fmt.Fprintln(&text, ev.Name)
			for _, a := range ev.Attributes {
				fmt.Fprintln(&text, a.Key, a.Value.String())
			}
		}
	}
	_, secret, _ := strings.Cut(key, ".")
	_, recSecret, _ := strings.Cut(rec, ".")
	for _, s := range []string{"4111-SECRET-PARAM", "PRIVATE-MEMO-77", "OTHER-SECRET-CARD", "RESULT-DATA-5521", "RESOURCE-ID-31", "FAILURE-MESSAGE-88",
		secret, recSecret, strings.Repeat("f", 64)} {
		if strings.Contains(text.String(), s) {
			t.Errorf("a span holds %q:\n%s", s, text.String())
		}
	}
	if !strings.Contains(text.String(), id) {
		t.Errorf("no span names the operation id:\n%s", text.String())
	}
}
