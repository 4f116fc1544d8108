package server_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// env is one ledgerd-like stack: a ledger on a backend, its sweeper, the gRPC
// service on a loopback port, and a client.
type env struct {
	c      ledgerv1.LedgerServiceClient
	conn   *grpc.ClientConn
	rdb    redis.UniversalClient
	ledger *ledger.Ledger
	logs   *ledgertest.Buffer
	ctx    context.Context
	prefix string // unique operation id prefix of the test
	// stop stops the service and its sweeper, as a crash of ledgerd would
	// (the test's end stops them too).
	stop func()
}

// eachBackend runs f against a real redis-server and the embedded engine.
func eachBackend(t *testing.T, f func(t *testing.T, e *env)) {
	t.Helper()
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		f(t, startEnv(t, rdb))
	})
}

func startEnv(t *testing.T, rdb redis.UniversalClient, dialOpts ...grpc.DialOption) *env {
	t.Helper()
	return startEnvLogging(t, rdb, slog.LevelDebug, dialOpts...)
}

// startEnvLogging is startEnv with the service's log at level.
func startEnvLogging(t *testing.T, rdb redis.UniversalClient, level slog.Level, dialOpts ...grpc.DialOption) *env {
	t.Helper()
	pol, err := ledger.ParsePolicies([]byte(ledgertest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	logs := &ledgertest.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: level}))
	l, err := ledger.New(rdb, ledger.Options{Policies: pol, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	svc := server.New(server.Config{Ledger: l, Logger: log})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	done := make(chan struct{})
	go func() { l.RunSweeper(ctx, 50*time.Millisecond); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
			defer c()
			svc.Shutdown(sctx)
		})
	}
	t.Cleanup(stop)
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dialOpts...)
	conn, err := grpc.NewClient(lis.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &env{
		c: ledgerv1.NewLedgerServiceClient(conn), conn: conn, rdb: rdb, ledger: l, logs: logs,
		ctx: context.Background(), prefix: t.Name() + "-" + randomHex(4) + ":", stop: stop,
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newHolder() string { return "h-" + randomHex(8) }

// id returns an operation id unique to the test.
func (e *env) id(name string) string { return e.prefix + name }

// errorInfo returns the code, ErrorInfo and BadRequest of a status error.
func errorInfo(t *testing.T, err error) (codes.Code, *errdetails.ErrorInfo, *errdetails.BadRequest) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || err == nil {
		t.Fatalf("not a status error: %v", err)
	}
	var ei *errdetails.ErrorInfo
	var br *errdetails.BadRequest
	for _, d := range st.Details() {
		switch v := d.(type) {
		case *errdetails.ErrorInfo:
			ei = v
		case *errdetails.BadRequest:
			br = v
		}
	}
	if ei == nil {
		t.Fatalf("status %v carries no ErrorInfo", st)
	}
	if ei.Domain != "ledger.v1" {
		t.Fatalf("ErrorInfo domain %q", ei.Domain)
	}
	return st.Code(), ei, br
}

// wantReason fails unless err is a status with this code and reason.
func wantReason(t *testing.T, err error, code codes.Code, reason string) *errdetails.ErrorInfo {
	t.Helper()
	c, ei, _ := errorInfo(t, err)
	if c != code || ei.Reason != reason {
		t.Fatalf("error %v: code %v reason %s, want %v %s", err, c, ei.Reason, code, reason)
	}
	return ei
}

func (e *env) lookup(t *testing.T, id string) *ledgerv1.Operation {
	t.Helper()
	r, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: id})
	if err != nil {
		t.Fatalf("Lookup(%s): %v", id, err)
	}
	return r.Operation
}

func codeOf(err error) codes.Code { return status.Code(err) }

func statusDetails(err error) []protoMessage {
	var out []protoMessage
	for _, d := range status.Convert(err).Details() {
		if m, ok := d.(protoMessage); ok {
			out = append(out, m)
		}
	}
	return out
}

type protoMessage = interface {
	ProtoReflect() protoreflect.Message
}
