package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
	"github.com/redis/go-redis/v9"
)

// serve runs ledgerd with args until the test ends, and returns a client.
func serve(t *testing.T, args ...string) (ledgerv1.LedgerServiceClient, *ledgertest.Buffer) {
	t.Helper()
	conn, _, out := start(t, insecure.NewCredentials(), args...)
	return ledgerv1.NewLedgerServiceClient(conn), out
}

// start runs ledgerd with args on 127.0.0.1:0 until the test ends, waits
// until it reports SERVING to a client with creds, and returns that
// client's connection, the address ledgerd bound and its log.
func start(t *testing.T, creds credentials.TransportCredentials, args ...string) (*grpc.ClientConn, string, *ledgertest.Buffer) {
	t.Helper()
	return startTuned(t, creds, nil, args...)
}

// startTuned is start with tune applied to ledgerd's configuration.
func startTuned(t *testing.T, creds credentials.TransportCredentials, tune func(*config), args ...string) (*grpc.ClientConn, string, *ledgertest.Buffer) {
	t.Helper()
	out := &ledgertest.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		runErr = runTuned(ctx, append([]string{"--listen", "127.0.0.1:0"}, args...), out, tune)
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
		if runErr != nil {
			t.Errorf("ledgerd: %v", runErr)
		}
		if !strings.Contains(out.String(), `"msg":"stopped"`) {
			t.Errorf("no clean stop in the log:\n%s", out.String())
		}
	})
	addr, err := ledgertest.ListenAddr(out.String, "ledgerd serving", exited, 10*time.Second)
	if err != nil {
		t.Fatalf("ledgerd: %v\n%s", err, out.String())
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := grpc_health_v1.NewHealthClient(conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{})
		if err == nil && r.Status == grpc_health_v1.HealthCheckResponse_SERVING {
			return conn, addr, out
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledgerd never served: %v\n%s", err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func reserveOnce(t *testing.T, c ledgerv1.LedgerServiceClient, tool string) *ledgerv1.ReserveResponse {
	t.Helper()
	r, err := c.Reserve(context.Background(), &ledgerv1.ReserveRequest{OperationId: "wf-1:step-1", Tool: tool, Holder: "h"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestEmbeddedEngineSaysNothingSurvives(t *testing.T) {
	t.Setenv("LEDGER_REDIS_URL", "")
	// The default mode, written out, is no Redis setting the embedded
	// engine refuses (cluster and sentinel are: TestRefusesBadConfiguration).
	t.Setenv("LEDGER_REDIS_MODE", "single")
	c, out := serve(t)
	if r := reserveOnce(t, c, "tickets.create"); r.Decision != ledgerv1.Decision_DECISION_EXECUTE {
		t.Fatalf("Reserve = %v", r)
	}
	if !strings.Contains(out.String(), "NOTHING SURVIVES A RESTART") {
		t.Fatalf("no loud warning:\n%s", out.String())
	}
}

func TestRedisURLAndPolicy(t *testing.T) {
	srv := redistest.Start(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("tools:\n  - match: \"tickets.*\"\n    effect: idempotent\n    max_attempts: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LEDGER_REDIS_URL", "redis://"+srv.Addr+"/0")
	c, out := serve(t, "--policy", policy, "--key-prefix", "ledgertest")
	r := reserveOnce(t, c, "tickets.create")
	if r.Operation.Effect != ledgerv1.Effect_EFFECT_IDEMPOTENT || r.Operation.MaxAttempts != 2 {
		t.Fatalf("the policy did not apply: %v", r.Operation)
	}
	if strings.Contains(out.String(), "EMBEDDED") {
		t.Fatal("embedded warning with a Redis URL")
	}
	keys, err := srv.Client(t).Keys(context.Background(), "ledgertest:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("nothing stored under the prefix in Redis: %v %v", keys, err)
	}
}

// TestCompactsTerminalRecords: ledgerd runs the compaction pass, which cuts
// a record past its retention to its tombstone and keeps its TTL.
func TestCompactsTerminalRecords(t *testing.T) {
	srv := redistest.Start(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("tools:\n  - match: \"tickets.*\"\n    retention: 1s\n    retain_grace: 0s\n    tombstone_retention: 1h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LEDGER_REDIS_URL", "redis://"+srv.Addr+"/0")
	t.Setenv("LEDGER_COMPACT_BATCH", "100")
	c, _ := serve(t, "--policy", policy)
	ctx := context.Background()
	r := reserveOnce(t, c, "tickets.create")
	if _, err := c.Complete(ctx, &ledgerv1.CompleteRequest{OperationId: "wf-1:step-1", FencingToken: r.Operation.FencingToken,
		Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: "customer-resource-4711"}}); err != nil {
		t.Fatal(err)
	}
	rdb := srv.Client(t)
	keys, err := rdb.Keys(ctx, "ledger:*:op:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("record keys %v (%v)", keys, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := rdb.Get(ctx, keys[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(v, "customer-resource-4711") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record was never compacted")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ttl, _ := rdb.PTTL(ctx, keys[0]).Result(); ttl < 50*time.Minute {
		t.Fatalf("TTL %v after compaction, want about the tombstone retention (1h)", ttl)
	}
	_, err = c.Reserve(ctx, &ledgerv1.ReserveRequest{OperationId: "wf-1:step-1", Tool: "tickets.create", Holder: "late"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("late Reserve after compaction: %v", err)
	}
}

func TestRefusesBadConfiguration(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("defaults:\n  lease: forever\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:50051"}, "loopback"},
		{[]string{"--listen", ":50051"}, "loopback"},
		{[]string{"--listen", "127.0.0.1:0", "--policy", bad}, "lease"},
		{[]string{"--listen", "127.0.0.1:0", "--policy", "/nonexistent.yaml"}, "no such file"},
		{[]string{"--listen", "127.0.0.1:0", "--redis-url", "http://x"}, "redis-url"},
		{[]string{"--listen", "127.0.0.1:0", "--redis-url", "redis://:s3cret-pw@127.0.0.1:1/0"}, "cannot use the store"},
		{[]string{"--listen", "127.0.0.1:0", "--log-level", "loud"}, "log-level"},
		{[]string{"--listen", "127.0.0.1:0", "--sweep-interval", "0s"}, "sweep-interval"},
		{[]string{"--listen", "127.0.0.1:0", "--compact-batch", "-1"}, "compact-batch"},
		{[]string{"--listen", "127.0.0.1:0", "--compact-batch", "10001"}, "compact-batch"},
		{[]string{"--listen", "127.0.0.1:0", "--rate-limit", "NaN"}, "rate-limit"},
		{[]string{"--listen", "127.0.0.1:0", "--rate-limit", "Inf"}, "rate-limit"},
		{[]string{"--listen", "127.0.0.1:0", "--rate-limit", "-1"}, "rate-limit"},
		// The embedded engine (no --redis-url) takes no Redis settings it
		// would ignore: a mode it does not know, replicas it does not have
		// (every call would fail NOT_REPLICATED), a CA for a TLS it never
		// speaks.
		{[]string{"--listen", "127.0.0.1:0", "--redis-mode", "clustr"}, "redis-mode"},
		{[]string{"--listen", "127.0.0.1:0", "--redis-mode", ""}, "redis-mode"},
		{[]string{"--listen", "127.0.0.1:0", "--wait-replicas", "1"}, "wait-replicas"},
		{[]string{"--listen", "127.0.0.1:0", "--redis-ca", "/nonexistent-ca.pem"}, "redis-ca"},
		// A topology without the servers it names.
		{[]string{"--listen", "127.0.0.1:0", "--redis-mode", "cluster"}, "--redis-mode cluster needs a Redis URL (set --redis-url)"},
		{[]string{"--listen", "127.0.0.1:0", "--redis-mode", "sentinel"}, "--redis-mode sentinel needs a Redis URL (set --redis-url)"},
	} {
		// A configuration accepted by mistake is stopped as soon as it
		// serves, and reported.
		ctx, cancel := context.WithCancel(context.Background())
		out := &cancelOn{marker: "ledgerd serving", cancel: cancel}
		err := run(ctx, tc.args, out)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error about %q", tc.args, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error()+out.String(), "s3cret-pw") {
			t.Errorf("%v: the password leaked: %v", tc.args, err)
		}
	}
}

// runAsLedgerd, set to 1 in the environment, makes the test binary run
// ledgerd's main with its arguments instead of the tests: a test that needs
// ledgerd in a process of its own (under other resource limits) starts it so.
const runAsLedgerd = "LEDGERD_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runAsLedgerd) == "1" {
		main()
		os.Exit(0)
	}
	redistest.Main(m)
}

func TestListenRules(t *testing.T) {
	for _, tc := range []struct {
		c    config
		want string // "" when allowed
	}{
		{config{listen: "127.0.0.1:1"}, ""},
		{config{listen: "[::1]:1"}, ""},
		{config{listen: "localhost:1"}, ""},
		{config{listen: "0.0.0.0:1"}, "auth-file"},
		{config{listen: "10.0.0.1:1", authFile: "f"}, "TLS"},
		{config{listen: "10.0.0.1:1", authFile: "f", allowPlaintext: true}, ""},
		{config{listen: "10.0.0.1:1", authFile: "f", tls: server.TLSFiles{Cert: "c", Key: "k"}}, ""},
		{config{listen: "10.0.0.1:1", tls: server.TLSFiles{Cert: "c", Key: "k"}}, "auth-file"},
	} {
		err := checkListen(tc.c)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
		}
	}
	// The address bound decides where a name went (TestLocalhostServedOnlyWhereItIsLoopback
	// runs ledgerd so).
	for _, tc := range []struct {
		c     config
		bound string
		want  string
	}{
		{config{listen: "localhost:1"}, "127.0.0.1:1", ""},
		{config{listen: "localhost:1"}, "[::1]:1", ""},
		{config{listen: "localhost:1"}, "10.0.0.1:1", "bound 10.0.0.1:1, which is not loopback: without authentication"},
		{config{listen: "localhost:1", authFile: "f"}, "10.0.0.1:1", "needs TLS"},
		{config{listen: "localhost:1", authFile: "f", tls: server.TLSFiles{Cert: "c", Key: "k"}}, "10.0.0.1:1", ""},
	} {
		bound, err := net.ResolveTCPAddr("tcp", tc.bound)
		if err != nil {
			t.Fatal(err)
		}
		err = checkBoundAs(tc.c, "--listen", tc.c.listen, bound)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v bound %s: %v, want %q", tc.c, tc.bound, err, tc.want)
		}
	}
}

// keygenEntry runs keygen and returns the key and the credentials entry.
func keygenEntry(t *testing.T, id, tenant, scopes string) (string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := keygen([]string{"--id", id, "--tenant", tenant, "--scopes", scopes}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	key := strings.TrimSpace(strings.TrimPrefix(lines[1], "#"))
	return key, lines[len(lines)-1]
}

func TestAuthFileAndReloadOnHangup(t *testing.T) {
	agentKey, agentEntry := keygenEntry(t, "acme-agent", "acme", "agent")
	viewerKey, viewerEntry := keygenEntry(t, "acme-viewer", "acme", "viewer")
	file := filepath.Join(t.TempDir(), "credentials.yaml")
	write := func(entries ...string) {
		if err := os.WriteFile(file, []byte("keys:\n"+strings.Join(entries, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(agentEntry, viewerEntry)
	c, out := serve(t, "--auth-file", file)
	as := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
	}
	req := &ledgerv1.ReserveRequest{OperationId: "wf-1:step-1", Tool: "tickets.create", Holder: "h"}
	if _, err := c.Reserve(context.Background(), req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Reserve without a key = %v", err)
	}
	if _, err := c.Reserve(as(agentKey), req); err != nil {
		t.Fatalf("Reserve with the agent key: %v", err)
	}
	if _, err := c.Reserve(as(viewerKey), req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Reserve with the viewer key = %v", err)
	}
	// Revoke the agent key and reload: the same connection refuses it.
	write(strings.Replace(agentEntry, "}", ", disabled: true}", 1), viewerEntry)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Lookup(as(agentKey), &ledgerv1.LookupRequest{OperationId: "wf-1:step-1"})
		if status.Code(err) == codes.Unauthenticated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revoked key still works after SIGHUP: %v\n%s", err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := c.Lookup(as(viewerKey), &ledgerv1.LookupRequest{OperationId: "wf-1:step-1"}); err != nil {
		t.Fatalf("the viewer key after the reload: %v", err)
	}
	for _, secret := range []string{agentKey, viewerKey} {
		_, s, _ := strings.Cut(secret, ".")
		if strings.Contains(out.String(), s) {
			t.Fatal("a key reached the log")
		}
	}
}

func TestKeygenRefusesBadInput(t *testing.T) {
	const scopeList = "want a comma-separated list of agent, reconciler and viewer"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tenant", "acme"}, "--id and --tenant are required"},
		{[]string{"--id", "a", "--tenant", "acme", "--scopes", "admin"}, `unknown scope "admin"`},
		{[]string{"--id", "bad id", "--tenant", "acme"}, `id "bad id"`},
		{[]string{"--id", "a", "--tenant", "acme", "--scopes", "agent,,viewer"}, `--scopes "agent,,viewer": ` + scopeList},
		{[]string{"--id", "a", "--tenant", "acme", "--scopes", "agent], tenant: [x"}, scopeList},
		{[]string{"--id", "a", "--tenant", "acme", "--scopes", ""}, scopeList},
		// A scope written without --scopes would be dropped, and the key
		// made with the default scope instead.
		{[]string{"--id", "a", "--tenant", "acme", "viewer"}, "unexpected arguments [viewer]"},
		{[]string{"--id", "a", "--tenant", "acme", "--", "--scopes", "viewer"}, "unexpected arguments [--scopes viewer]"},
	} {
		if err := keygen(c.args, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("keygen %q: %v, want %q", c.args, err, c.want)
		}
	}
	if _, entry := keygenEntry(t, "a", "acme", " agent , viewer"); !strings.Contains(entry, "scopes: [agent, viewer]") {
		t.Errorf("keygen --scopes ' agent , viewer': %s", entry)
	}
}

// TestKeygenHelp: ledgerd keygen -h prints its flags and succeeds (exit
// 0), as ledgerd -h does, and makes no key.
func TestKeygenHelp(t *testing.T) {
	for _, h := range []string{"-h", "--help"} {
		var out, errOut bytes.Buffer
		if err := keygen([]string{h}, &out, &errOut); err != nil {
			t.Errorf("keygen %s: %v", h, err)
		}
		if out.Len() != 0 {
			t.Errorf("keygen %s printed a key: %s", h, out.String())
		}
		for _, f := range []string{"-id", "-tenant", "-scopes"} {
			if !strings.Contains(errOut.String(), f) {
				t.Errorf("keygen %s: the usage lacks %s: %s", h, f, errOut.String())
			}
		}
	}
}

// serverCert issues a ledgerd certificate for 127.0.0.1 from a new test CA
// in dir; it returns its files and the CA's pool.
func serverCert(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	pki := ledgertest.NewPKI(t, dir)
	_, certFile, keyFile = pki.Issue(t, "ledgerd", "ledgerd", true)
	return certFile, keyFile, pki.Pool
}

func TestTLSFromFiles(t *testing.T) {
	certFile, keyFile, pool := serverCert(t, t.TempDir())
	tlsCreds := credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	_, addr, _ := start(t, tlsCreds, "--tls-cert", certFile, "--tls-key", keyFile)
	plain, _ := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer plain.Close()
	if _, err := grpc_health_v1.NewHealthClient(plain).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{}); err == nil {
		t.Fatal("a plaintext client got through a TLS listener")
	}
}

// TestClientCertificatesFromFiles: with --tls-client-ca, a client
// certificate that CA issued, mapped to a tenant by the credentials file,
// is that tenant's credential; a TLS client without one, or with one of
// another CA, is not let in.
func TestClientCertificatesFromFiles(t *testing.T) {
	dir := t.TempDir()
	pki := ledgertest.NewPKI(t, dir)
	_, serverCert, serverKey := pki.Issue(t, "ledgerd", "ledgerd", true)
	agent, _, _ := pki.Issue(t, "agent", "agent-1.acme.internal", false)
	stranger, _, _ := ledgertest.NewPKI(t, t.TempDir()).Issue(t, "agent", "agent-1.acme.internal", false)
	auth := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(auth, []byte("clients:\n  - {common_name: agent-1.acme.internal, tenant: acme, scopes: [agent]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	creds := func(cert *tls.Certificate) credentials.TransportCredentials {
		c := &tls.Config{RootCAs: pki.Pool, MinVersion: tls.VersionTLS12}
		if cert != nil {
			c.Certificates = []tls.Certificate{*cert}
		}
		return credentials.NewTLS(c)
	}
	conn, addr, _ := start(t, creds(&agent), "--tls-cert", serverCert, "--tls-key", serverKey, "--tls-client-ca", pki.CAFile, "--auth-file", auth)
	for _, tc := range []struct {
		name string
		conn *grpc.ClientConn
		want codes.Code
	}{
		{"the mapped certificate", conn, codes.OK},
		{"no certificate", dialTLS(t, addr, creds(nil)), codes.Unauthenticated},
		{"another CA's certificate", dialTLS(t, addr, creds(&stranger)), codes.Unavailable},
	} {
		_, err := ledgerv1.NewLedgerServiceClient(tc.conn).Reserve(context.Background(),
			&ledgerv1.ReserveRequest{OperationId: "wf-1:" + tc.name, Tool: "tickets.create", Holder: "h"})
		if status.Code(err) != tc.want {
			t.Errorf("%s: Reserve = %v, want %v", tc.name, err, tc.want)
		}
	}
}

// dialTLS connects to addr with creds until the test ends.
func dialTLS(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestRedisOverTLSAsRestrictedUser runs ledgerd against a redis-server that
// only speaks TLS, as the least-privileged ACL user, from the URL.
func TestRedisOverTLSAsRestrictedUser(t *testing.T) {
	pki := ledgertest.NewPKI(t, t.TempDir())
	_, certFile, keyFile := pki.Issue(t, "redis", "redis", true)
	srv := redistest.StartTLS(t, certFile, keyFile, pki.CAFile, &tls.Config{RootCAs: pki.Pool, MinVersion: tls.VersionTLS12})
	srv.CreateUser(t, "ledger", "s3cret-redis-pw", ledger.ACLRules(ledger.DefaultPrefix))
	c, out := serve(t, "--redis-url", "rediss://ledger:s3cret-redis-pw@"+srv.Addr+"/0", "--redis-ca", pki.CAFile)
	if r := reserveOnce(t, c, "tickets.create"); r.Decision != ledgerv1.Decision_DECISION_EXECUTE {
		t.Fatalf("Reserve = %v", r)
	}
	keys, err := srv.Client(t).Keys(context.Background(), "ledger:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("nothing stored over TLS: %v %v", keys, err)
	}
	if strings.Contains(out.String(), "s3cret-redis-pw") {
		t.Fatal("the Redis password reached the log")
	}
}

func TestRequireDurable(t *testing.T) {
	unsafe := redistest.Start(t) // appendonly no, appendfsync everysec
	err := run(context.Background(), []string{"--listen", "127.0.0.1:0", "--redis-url", "redis://" + unsafe.Addr, "--require-durable"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "appendonly") || !strings.Contains(err.Error(), "appendfsync") {
		t.Fatalf("--require-durable on an unsafe Redis = %v", err)
	}
	if err := run(context.Background(), []string{"--listen", "127.0.0.1:0", "--require-durable"}, io.Discard); err == nil || !strings.Contains(err.Error(), "embedded") {
		t.Fatalf("--require-durable on the embedded engine = %v", err)
	}

	safe := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")
	c, out := serve(t, "--redis-url", "redis://"+safe.Addr, "--require-durable", "--metrics-listen", "127.0.0.1:0")
	metricsAddr, err := ledgertest.ListenAddr(out.String, "metrics serving", nil, 10*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	reserveOnce(t, c, "tickets.create")
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`ledger_store_durability_ok{check="appendfsync"} 1`, `ledger_decisions_total{decision="execute",tool="tickets.create"} 1`, "grpc_server_handled_total"} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "unsafe") {
		t.Fatalf("warnings on a durable Redis:\n%s", out.String())
	}
}

// TestMetricsCountRefusedCalls: the RPC metrics ledgerd serves count the
// calls that authentication, the scope check and the rate limit refuse.
func TestMetricsCountRefusedCalls(t *testing.T) {
	agentKey, agentEntry := keygenEntry(t, "acme-agent", "acme", "agent")
	viewerKey, viewerEntry := keygenEntry(t, "acme-viewer", "acme", "viewer")
	file := filepath.Join(t.TempDir(), "credentials.yaml")
	if err := os.WriteFile(file, []byte("keys:\n"+agentEntry+"\n"+viewerEntry+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, out := serve(t, "--auth-file", file, "--rate-limit", "0.01", "--rate-burst", "1", "--metrics-listen", "127.0.0.1:0")
	metricsAddr, err := ledgertest.ListenAddr(out.String, "metrics serving", nil, 10*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	as := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
	}
	req := &ledgerv1.LookupRequest{OperationId: "wf-1:step-1"}
	if _, err := c.Lookup(context.Background(), req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Lookup without a key = %v", err)
	}
	if _, err := c.Reserve(as(viewerKey), &ledgerv1.ReserveRequest{OperationId: "wf-1:step-1", Tool: "tickets.create", Holder: "h"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Reserve with the viewer key = %v", err)
	}
	if _, err := c.Lookup(as(agentKey), req); status.Code(err) != codes.NotFound {
		t.Fatalf("Lookup within the burst = %v", err)
	}
	if _, err := c.Lookup(as(agentKey), req); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Lookup over the rate = %v", err)
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`grpc_server_started_total{grpc_method="Lookup",grpc_service="ledger.v1.LedgerService",grpc_type="unary"} 3`,
		`grpc_server_handled_total{grpc_code="Unauthenticated",grpc_method="Lookup",grpc_service="ledger.v1.LedgerService",grpc_type="unary"} 1`,
		`grpc_server_handled_total{grpc_code="ResourceExhausted",grpc_method="Lookup",grpc_service="ledger.v1.LedgerService",grpc_type="unary"} 1`,
		`grpc_server_handled_total{grpc_code="NotFound",grpc_method="Lookup",grpc_service="ledger.v1.LedgerService",grpc_type="unary"} 1`,
		`grpc_server_handled_total{grpc_code="PermissionDenied",grpc_method="Reserve",grpc_service="ledger.v1.LedgerService",grpc_type="unary"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestDurabilityWarnings(t *testing.T) {
	unsafe := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	_, out := serve(t, "--redis-url", "redis://"+unsafe.Addr)
	for _, s := range []string{"appendonly is unsafe", "appendfsync is unsafe", "maxmemory-policy is unsafe"} {
		if !strings.Contains(out.String(), s) {
			t.Fatalf("the log lacks %q:\n%s", s, out.String())
		}
	}
}

func TestRedisModes(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.SharedCluster(t)
		addrs := cl.Addrs()
		url := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
		c, out := serve(t, "--redis-mode", "cluster", "--redis-url", url, "--wait-replicas", "1", "--wait-timeout", "2s")
		// The cluster outlives the test (-count=N reruns it): ids of this run.
		run := fmt.Sprintf("modes%x-", time.Now().UnixNano())
		for i := range 20 {
			r, err := c.Reserve(context.Background(), &ledgerv1.ReserveRequest{OperationId: fmt.Sprintf("%s%d", run, i), Tool: "t.x", Holder: "h"})
			if err != nil || r.Decision != ledgerv1.Decision_DECISION_EXECUTE {
				t.Fatalf("Reserve on the cluster = %v, %v\n%s", r, err, out.String())
			}
		}
		// The operations are spread over the masters.
		var masters atomic.Int32
		err := cl.Client(t).ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error {
			keys, err := n.Keys(ctx, "ledger:*:op:*"+run+"*").Result()
			if len(keys) > 0 {
				masters.Add(1)
			}
			return err
		})
		if err != nil || masters.Load() < 2 {
			t.Fatalf("operations on %d masters (%v)", masters.Load(), err)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		master := redistest.Start(t)
		sentinel := redistest.StartSentinel(t, master, "ledgermaster")
		c, out := serve(t, "--redis-mode", "sentinel", "--redis-url", "redis://"+sentinel.Addr+"?master_name=ledgermaster")
		if r := reserveOnce(t, c, "tickets.create"); r.Decision != ledgerv1.Decision_DECISION_EXECUTE {
			t.Fatalf("Reserve through sentinel = %v\n%s", r, out.String())
		}
		if n, _ := master.Client(t).DBSize(context.Background()).Result(); n == 0 {
			t.Fatal("nothing written to the master sentinel named")
		}
	})
	t.Run("bad", func(t *testing.T) {
		for _, args := range [][]string{
			{"--redis-mode", "ring", "--redis-url", "redis://127.0.0.1:1"},
			{"--redis-mode", "sentinel", "--redis-url", "redis://127.0.0.1:1"},
			{"--wait-replicas", "-1"},
		} {
			if err := run(context.Background(), append([]string{"--listen", "127.0.0.1:0"}, args...), io.Discard); err == nil {
				t.Errorf("%v accepted", args)
			}
		}
	})
}

// TestHangupWhileStarting: a SIGHUP that arrives while ledgerd is still
// connecting to Redis (here held up by a proxy that forwards nothing until
// released) must not end the process, as SIGHUP's default action would: it
// is kept, and the reload it asks for runs once ledgerd serves.
func TestHangupWhileStarting(t *testing.T) {
	srv := redistest.Shared(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	accepted, release := make(chan struct{}, 1), make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case accepted <- struct{}{}:
			default:
			}
			go func() {
				defer c.Close()
				<-release
				r, err := net.Dial("tcp", srv.Addr)
				if err != nil {
					return
				}
				defer r.Close()
				go func() { _, _ = io.Copy(r, c) }()
				_, _ = io.Copy(c, r)
			}()
		}
	}()
	_, entry := keygenEntry(t, "acme-agent", "acme", "agent")
	file := filepath.Join(t.TempDir(), "credentials.yaml")
	if err := os.WriteFile(file, []byte("keys:\n"+entry+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The proxy is released once the signal has reached ledgerd, so that
	// it arrives while ledgerd starts, however slow the machine. The test's
	// own channel tells when os/signal has the signal; it hands a signal to
	// every channel registered for it under one lock, which signal.Stop
	// takes: once Stop returns, ledgerd's channel has it too.
	caught := make(chan os.Signal, 1)
	signal.Notify(caught, syscall.SIGHUP)
	t.Cleanup(func() { signal.Stop(caught) })
	go func() {
		defer close(release)
		select {
		case <-accepted: // ledgerd is starting: its first Redis command waits
		case <-time.After(10 * time.Second):
			return // ledgerd never reached Redis: start fails the test
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGHUP)
		select {
		case <-caught:
		case <-time.After(10 * time.Second):
		}
		signal.Stop(caught)
	}()
	_, _, out := start(t, insecure.NewCredentials(), "--redis-url", "redis://"+ln.Addr().String()+"/0", "--auth-file", file)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "reload: credentials file loaded") {
		if time.Now().After(deadline) {
			t.Fatalf("the SIGHUP sent while starting was not acted on once serving:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cancelOn is a log writer that cancels a context when a line holding
// marker is written.
type cancelOn struct {
	ledgertest.Buffer
	marker string
	cancel context.CancelFunc
}

func (w *cancelOn) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.marker) {
		w.cancel()
	}
	return w.Buffer.Write(p)
}

// TestStopRequestedAsServingStarts: a stop (SIGTERM, here the run's context)
// that arrives between the last step of starting and the gRPC server's
// Serve is a clean stop, not an error: the server stopped before it served
// is what was asked for.
func TestStopRequestedAsServingStarts(t *testing.T) {
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		out := &cancelOn{marker: "ledgerd serving", cancel: cancel}
		err := run(ctx, []string{"--listen", "127.0.0.1:0"}, out)
		cancel()
		if err != nil || !strings.Contains(out.String(), `"msg":"stopped"`) {
			t.Fatalf("run %d, stopped as it started serving: %v\n%s", i, err, out.String())
		}
	}
}

// TestDurabilityFollowsARunningRedis: a setting changed on a running Redis
// (CONFIG SET appendonly no, then yes) moves ledger_store_durability_ok
// (LedgerStoreNotDurable) and is logged, without restarting ledgerd.
func TestDurabilityFollowsARunningRedis(t *testing.T) {
	safe := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")
	_, _, out := startTuned(t, insecure.NewCredentials(), func(c *config) { c.durabilityEvery = 20 * time.Millisecond },
		"--redis-url", "redis://"+safe.Addr, "--metrics-listen", "127.0.0.1:0")
	metricsAddr := metricsAddrOf(t, out)
	waitFor := func(sample, logged string) {
		t.Helper()
		waitForMetrics(t, metricsAddr, out, logged, sample)
	}
	waitFor(`ledger_store_durability_ok{check="appendonly"} 1`, "ledgerd serving")
	rdb := safe.Client(t)
	if err := rdb.ConfigSet(context.Background(), "appendonly", "no").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(`ledger_store_durability_ok{check="appendonly"} 0`, "appendonly is unsafe")
	if err := rdb.ConfigSet(context.Background(), "appendonly", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(`ledger_store_durability_ok{check="appendonly"} 1`, "appendonly is safe again")
}

// TestReloadsShowInMetrics: whether the credentials and TLS files loaded at
// the last SIGHUP, and when the served certificate expires, can be alerted
// on: a file broken on disk would stop the next start.
func TestReloadsShowInMetrics(t *testing.T) {
	dir := t.TempDir()
	firstEnd := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	pki := ledgertest.NewPKI(t, dir)
	_, certFile, keyFile := pki.IssueUntil(t, "ledgerd", "ledgerd", true, firstEnd)
	pool := pki.Pool
	_, entry := keygenEntry(t, "acme-agent", "acme", "agent")
	file := filepath.Join(dir, "credentials.yaml")
	write := func(text string) {
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("keys:\n" + entry + "\n")
	tlsCreds := credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	_, _, out := start(t, tlsCreds, "--auth-file", file, "--tls-cert", certFile, "--tls-key", keyFile, "--metrics-listen", "127.0.0.1:0")
	metricsAddr := metricsAddrOf(t, out)
	waitFor := func(samples ...string) {
		t.Helper()
		waitForMetrics(t, metricsAddr, out, "", samples...)
	}
	expiry := func(t time.Time) string {
		return "ledger_tls_certificate_expiry_timestamp_seconds " + strconv.FormatFloat(float64(t.Unix()), 'g', -1, 64)
	}
	waitFor(`ledger_config_last_reload_successful{file="credentials"} 1`,
		`ledger_config_last_reload_successful{file="tls"} 1`, expiry(firstEnd))

	// A broken credentials file and a renewed certificate: the first reload
	// fails (the previous keys stay), the second succeeds.
	write("keys: [")
	secondEnd := firstEnd.Add(24 * time.Hour)
	pki.IssueUntil(t, "ledgerd", "ledgerd", true, secondEnd)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(`ledger_config_last_reload_successful{file="credentials"} 0`,
		`ledger_config_last_reload_successful{file="tls"} 1`, expiry(secondEnd))

	write("keys:\n" + entry + "\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(`ledger_config_last_reload_successful{file="credentials"} 1`)
}

// metricsAddrOf returns the address of the metrics endpoint ledgerd logged.
func metricsAddrOf(t *testing.T, out *ledgertest.Buffer) string {
	t.Helper()
	addr, err := ledgertest.ListenAddr(out.String, "metrics serving", nil, 10*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return addr
}

// waitForMetrics polls ledgerd's /metrics at addr until every sample line
// is there and its log holds logged ("" for nothing), for up to 10 s.
func waitForMetrics(t *testing.T, addr string, out *ledgertest.Buffer, logged string, samples ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		missing := ""
		for _, s := range samples {
			if !strings.Contains(string(body), s+"\n") {
				missing = s
			}
		}
		if missing == "" && strings.Contains(out.String(), logged) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q or the log %q:\n%s\nlog:\n%s", missing, logged, body, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
