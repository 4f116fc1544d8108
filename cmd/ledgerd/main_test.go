package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// serve runs ledgerd with args until the test ends, and returns a client.
func serve(t *testing.T, args ...string) (ledgerv1.LedgerServiceClient, *lockedBuffer) {
	t.Helper()
	addr := freeAddr(t)
	out := &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, append([]string{"--listen", addr}, args...), out) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ledgerd: %v", err)
		}
		if !strings.Contains(out.String(), `"msg":"stopped"`) {
			t.Errorf("no clean stop in the log:\n%s", out.String())
		}
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := grpc_health_v1.NewHealthClient(conn).Check(context.Background(), &grpc_health_v1.HealthCheckRequest{})
		if err == nil && r.Status == grpc_health_v1.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledgerd never served: %v\n%s", err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ledgerv1.NewLedgerServiceClient(conn), out
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
	} {
		var out bytes.Buffer
		err := run(context.Background(), tc.args, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error about %q", tc.args, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error()+out.String(), "s3cret-pw") {
			t.Errorf("%v: the password leaked: %v", tc.args, err)
		}
	}
}

func TestMain(m *testing.M) { redistest.Main(m) }
