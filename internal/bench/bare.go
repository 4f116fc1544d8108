package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/opledger/ledger/internal/autopipe"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

// The bare server is the reference the goals were set against: a
// gRPC server with nothing but grpc.health.v1, whose Check sends one
// EVALSHA of a trivial script to Redis (through the same go-redis client
// and auto-pipelining hook as ledgerd) before it answers. It is the floor
// of "one Redis round trip per call" on this machine: what any service
// that consults Redis once per call costs, with no work of its own.
//
// Its ledger variant (BareOptions.Ledger) calls ledger.Reserve of a new
// operation instead, with the request the Reserve scenario sends: the
// ledger's own work (validation, fingerprint, the Reserve script, decoding
// the record) inside the bare server's small messages and empty
// interceptor chain. Between the two variants and ledgerd, a Reserve's cost
// splits into the Redis hop, the ledger's work and the service's gRPC
// surface (its messages and interceptors).

// bareScript does nothing: the round trip is what is measured.
var bareScript = redis.NewScript("return 1")

// bareHealth answers Check after one EVALSHA, or one ledger.Reserve when l
// is set.
type bareHealth struct {
	healthpb.UnimplementedHealthServer
	rdb *redis.Client
	l   *ledger.Ledger
	run string       // operation ids of this process: RunID
	seq atomic.Int64 // and a sequence number
}

// bareWho is the ledger variant's caller.
var bareWho = ledger.Principal{Tenant: "default", ID: "bench"}

func (h *bareHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if h.l != nil {
		n := h.seq.Add(1)
		op, err := h.l.Reserve(ctx, bareWho, ledger.ReserveRequest{
			OperationID: OperationID(h.run, n), Tool: "payments.refund", Params: refundParams,
			PermitID: "approval-77", Holder: holder(n),
		})
		if err != nil {
			return nil, err
		}
		if op.Decision != ledger.DecisionExecute {
			return nil, fmt.Errorf("bare ledger: Reserve of a new operation decided %v", op.Decision)
		}
	} else if err := bareScript.Run(ctx, h.rdb, nil).Err(); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// BareOptions configure the bare server.
type BareOptions struct {
	Listen    string // gRPC listen address
	RedisAddr string // the Redis of the one script call per Check
	Plain     bool   // a plain go-redis client, without auto-pipelining
	// Ledger makes each Check a ledger.Reserve of a new operation (keys
	// under BarePrefix, the benchmark's policy) instead of a trivial script.
	Ledger bool
	// Listener, when set, is served instead of a listener on Listen (a
	// test's, bound to port 0).
	Listener net.Listener
}

// BareMain parses the bare server's flags from args (exiting 2 on a usage
// error, as flag.ExitOnError does) and runs ServeBare until ctx ends.
func BareMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(BareCommand, flag.ExitOnError)
	var o BareOptions
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:0", "gRPC listen address")
	fs.StringVar(&o.RedisAddr, "redis-addr", "", "the Redis of the one EVALSHA per call")
	fs.BoolVar(&o.Plain, "plain", false, "a plain go-redis client, without auto-pipelining")
	fs.BoolVar(&o.Ledger, "ledger", false, "each Check is a ledger.Reserve of a new operation instead of a trivial script")
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "ledgerbench %s: unexpected arguments: %v\n", BareCommand, fs.Args())
		os.Exit(2)
	}
	return ServeBare(ctx, o)
}

// BarePrefix is the key prefix of the ledger variant's records, apart from
// ledgerd's so that ledgerd's sweeper never reads them.
const BarePrefix = "benchbare"

// ServeBare runs the bare server until ctx ends.
func ServeBare(ctx context.Context, o BareOptions) error {
	rdb := redis.NewClient(&redis.Options{Addr: o.RedisAddr, DisableIdentity: true})
	defer rdb.Close()
	if !o.Plain {
		h := autopipe.Enable(rdb, autopipe.Options{})
		defer h.Close()
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s: %w", o.RedisAddr, err)
	}
	h := &bareHealth{rdb: rdb, run: RunID()}
	if o.Ledger {
		pol, err := ledger.ParsePolicies([]byte(benchPolicy))
		if err != nil {
			return err
		}
		// As ledgerd runs in the benchmark: a limit no run reaches, so that
		// the check runs.
		h.l, err = ledger.New(rdb, ledger.Options{Prefix: BarePrefix, Policies: pol, UnresolvedLimit: func(string) int { return 1_000_000_000 }})
		if err != nil {
			return err
		}
		if err := h.l.LoadScripts(ctx); err != nil {
			return err
		}
	}
	ln := o.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", o.Listen); err != nil {
			return err
		}
	}
	// ledgerd's goroutines for the calls, so that the ratio to it counts
	// ledgerd's own work only.
	s := grpc.NewServer(grpc.NumStreamWorkers(server.StreamWorkers))
	healthpb.RegisterHealthServer(s, h)
	go func() { <-ctx.Done(); s.Stop() }()
	if err := s.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// startBare starts the bare server (its ledger variant when withLedger)
// as its own process (the benchmark's binary, with its serve-bare
// command), so that it costs what a separate service costs, on the
// throughput stack's Redis.
func (c *Config) startBare(redisAddr string, withLedger bool) (*Process, error) {
	args, log := []string{"--redis-addr", redisAddr}, "bare.log"
	if withLedger {
		args, log = append(args, "--ledger"), "bare-ledger.log"
	}
	return c.startBareLogged(filepath.Join(c.Dir, log), args...)
}

// startBareLogged starts the bare server with args, its output to log.
func (c *Config) startBareLogged(log string, args ...string) (*Process, error) {
	return onFreePort(func(addr string) (*Process, error) {
		return startServing(c.placement, c.BareServer, append([]string{BareCommand, "--listen", addr}, args...), addr, log, "the bare server")
	})
}

// BareCommand is the benchmark binary's command that runs the bare server:
// cmd/ledgerbench calls ServeBare when its first argument is this.
const BareCommand = "serve-bare"

// BareName is the bare server's scenario in the report.
const BareName = "bare server: Check + 1 EVALSHA"

// BareLedgerName is its ledger variant's scenario.
const BareLedgerName = "bare server: Check + ledger.Reserve"

// bareVariants are the bare server's scenarios, by their --only key: the
// plain one, then the ledger variant. A variant not selected is not
// started, so it has no phases either.
var bareVariants = [2]struct{ key, name string }{{"bare", BareName}, {"bare-ledger", BareLedgerName}}
