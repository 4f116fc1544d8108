// Package servicetest runs a whole ledger service for tests of its clients:
// the ledger on a given store, its sweeper, and the gRPC service on a free
// loopback port, all stopped when the test ends.
package servicetest

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/receipt"
	"github.com/opledger/ledger/server"
)

// Stack is a running ledger service.
type Stack struct {
	// Addr is the service's host:port.
	Addr string
	// Ledger is the ledger behind it.
	Ledger *ledger.Ledger
	// Service is the gRPC service; Stop it to make the ledger unreachable.
	Service *server.Service
}

// Options configure Start.
type Options struct {
	// Policy is a policy document (YAML); empty for the defaults.
	Policy string
	// Logger receives the service's logs (discarded when nil).
	Logger *slog.Logger
	// SweepInterval is how often expired leases are swept (50ms when zero).
	SweepInterval time.Duration
	// Credentials turn authentication on (nil: every caller is "default").
	Credentials *server.Credentials
	// Rate and Burst bound each tenant's calls (server.Config; 0: no limit).
	Rate  float64
	Burst int
	// Prefix is the first segment of the ledger's keys (ledger.Options):
	// a ledger of its own on a shared Redis.
	Prefix string
	// Receipts signs receipts (server.Config; nil: off).
	Receipts *receipt.Signer
	// NoFunctions sends the scripts by EVALSHA (ledger.Options).
	NoFunctions bool
	// TLS, when set, serves TLS with it (its ClientAuth asks for client
	// certificates).
	TLS *tls.Config
}

// Start runs a ledger service on rdb until the test ends.
func Start(tb testing.TB, rdb redis.UniversalClient, o Options) *Stack {
	tb.Helper()
	pol := ledger.DefaultPolicies()
	if o.Policy != "" {
		var err error
		if pol, err = ledger.ParsePolicies([]byte(o.Policy)); err != nil {
			tb.Fatal(err)
		}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.SweepInterval <= 0 {
		o.SweepInterval = 50 * time.Millisecond
	}
	l, err := ledger.New(rdb, ledger.Options{Policies: pol, Logger: log, Prefix: o.Prefix, NoFunctions: o.NoFunctions})
	if err != nil {
		tb.Fatal(err)
	}
	cfg := server.Config{Ledger: l, Logger: log, Rate: o.Rate, Burst: o.Burst, Receipts: o.Receipts}
	if o.Credentials != nil {
		cfg.Auth = server.NewAuthenticator(o.Credentials)
	}
	var opts []grpc.ServerOption
	if o.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(o.TLS)))
	}
	svc := server.New(cfg, opts...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	ctx, cancel := context.WithCancel(context.Background())
	swept := make(chan struct{})
	go func() { l.RunSweeper(ctx, o.SweepInterval); close(swept) }()
	tb.Cleanup(func() {
		cancel()
		<-swept
		sctx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		svc.Shutdown(sctx)
	})
	return &Stack{Addr: lis.Addr().String(), Ledger: l, Service: svc}
}
