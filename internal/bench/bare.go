package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/opledger/ledger/internal/autopipe"
)

// The bare server is the reference the goals were set against: a
// gRPC server with nothing but grpc.health.v1, whose Check sends one
// EVALSHA of a trivial script to Redis (through the same go-redis client
// and auto-pipelining hook as ledgerd) before it answers. It is the floor
// of "one Redis round trip per call" on this machine: what any service
// that consults Redis once per call costs, with no work of its own.

// bareScript does nothing: the round trip is what is measured.
var bareScript = redis.NewScript("return 1")

// bareHealth answers Check after one EVALSHA.
type bareHealth struct {
	healthpb.UnimplementedHealthServer
	rdb *redis.Client
}

func (h *bareHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := bareScript.Run(ctx, h.rdb, nil).Err(); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// ServeBare runs the bare server on listen until ctx ends, against the
// Redis at redisAddr, auto-pipelined unless plain is set.
func ServeBare(ctx context.Context, listen, redisAddr string, plain bool) error {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, DisableIdentity: true})
	defer rdb.Close()
	if !plain {
		h := autopipe.Enable(rdb, autopipe.Options{})
		defer h.Close()
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s: %w", redisAddr, err)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, &bareHealth{rdb: rdb})
	go func() { <-ctx.Done(); s.Stop() }()
	if err := s.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// startBare starts the bare server as its own process (the benchmark's
// binary, with its serve-bare command), so that it costs what a separate
// service costs, on the throughput stack's Redis.
func (c *Config) startBare(redisAddr string) (*Process, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	return startServing(c.BareServer, []string{BareCommand, "--listen", addr, "--redis-addr", redisAddr},
		addr, filepath.Join(c.Dir, "bare.log"), "the bare server")
}

// BareCommand is the benchmark binary's command that runs the bare server:
// cmd/ledgerbench calls ServeBare when its first argument is this.
const BareCommand = "serve-bare"

// BareName is the bare server's scenario in the report.
const BareName = "bare server: Check + 1 EVALSHA"
