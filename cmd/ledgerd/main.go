// Command ledgerd runs the operation ledger: the gRPC service
// ledger.v1.LedgerService, with health and reflection, on Redis.
//
// With no Redis configured it runs on an embedded in-process engine, for
// trying it out: nothing survives a restart. Configuration comes from flags,
// or from the environment when a flag is not given:
//
//	--listen            LEDGER_LISTEN            address to serve (127.0.0.1:50051); loopback only
//	--redis-url         LEDGER_REDIS_URL         redis://[user:password@]host:port/db, rediss:// for TLS
//	--policy            LEDGER_POLICY            policy file (YAML or JSON); defaults when absent
//	--key-prefix        LEDGER_KEY_PREFIX        first segment of every Redis key (ledger)
//	--sweep-interval    LEDGER_SWEEP_INTERVAL    how often expired leases are swept (1s)
//	--log-level         LEDGER_LOG_LEVEL         debug, info, warn or error (info)
//	--shutdown-timeout  LEDGER_SHUTDOWN_TIMEOUT  how long running calls may finish at shutdown (10s)
//
// It stops on SIGINT or SIGTERM: health turns NOT_SERVING, running calls
// finish (up to --shutdown-timeout), then it exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ledgerd:", err)
		os.Exit(1)
	}
}

type config struct {
	listen          string
	redisURL        string
	policy          string
	prefix          string
	sweepInterval   time.Duration
	shutdownTimeout time.Duration
	logLevel        string
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("ledgerd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.listen, "listen", env("LEDGER_LISTEN", "127.0.0.1:50051"), "address to serve gRPC on (loopback only) [LEDGER_LISTEN]")
	fs.StringVar(&c.redisURL, "redis-url", env("LEDGER_REDIS_URL", ""), "Redis URL, e.g. redis://127.0.0.1:6379/0; empty runs the embedded engine (nothing survives a restart) [LEDGER_REDIS_URL]")
	fs.StringVar(&c.policy, "policy", env("LEDGER_POLICY", ""), "policy file (YAML or JSON); empty uses the defaults [LEDGER_POLICY]")
	fs.StringVar(&c.prefix, "key-prefix", env("LEDGER_KEY_PREFIX", ledger.DefaultPrefix), "first segment of every Redis key [LEDGER_KEY_PREFIX]")
	fs.StringVar(&c.logLevel, "log-level", env("LEDGER_LOG_LEVEL", "info"), "debug, info, warn or error [LEDGER_LOG_LEVEL]")
	sweep := fs.String("sweep-interval", env("LEDGER_SWEEP_INTERVAL", ledger.DefaultSweepInterval.String()), "how often expired leases are swept [LEDGER_SWEEP_INTERVAL]")
	shutdown := fs.String("shutdown-timeout", env("LEDGER_SHUTDOWN_TIMEOUT", "10s"), "how long running calls may take to finish at shutdown [LEDGER_SHUTDOWN_TIMEOUT]")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	d, err := time.ParseDuration(*sweep)
	if err != nil || d <= 0 {
		return c, fmt.Errorf("--sweep-interval %q: want a positive duration like 1s", *sweep)
	}
	c.sweepInterval = d
	if c.shutdownTimeout, err = time.ParseDuration(*shutdown); err != nil || c.shutdownTimeout < 0 {
		return c, fmt.Errorf("--shutdown-timeout %q: want a duration like 10s", *shutdown)
	}
	return c, nil
}

// checkLoopback refuses to serve beyond this machine: without authentication
// any caller could read and write every operation.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("--listen %q: without authentication ledgerd only serves a loopback address (127.0.0.1, ::1 or localhost)", addr)
}

func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

const embeddedBanner = `
==========================================================================
 ledgerd runs on the EMBEDDED in-process engine: every operation lives in
 this process's memory and NOTHING SURVIVES A RESTART. Use it to try the
 ledger out, never in front of real side effects. For durable storage set
 LEDGER_REDIS_URL (or --redis-url), e.g. redis://127.0.0.1:6379/0
==========================================================================
`

// openStore connects to Redis, or starts the embedded engine when no URL is
// configured. The returned stop releases what it started.
func openStore(c config, log *slog.Logger, stderr io.Writer) (redis.UniversalClient, func(), error) {
	if c.redisURL == "" {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true) // TTLs (retention, tombstones) run in real time
		if err := m.Start(); err != nil {
			return nil, nil, fmt.Errorf("embedded engine: %w", err)
		}
		fmt.Fprint(stderr, embeddedBanner)
		log.Warn("running on the embedded engine: nothing survives a restart; set LEDGER_REDIS_URL for durable storage")
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true, ContextTimeoutEnabled: true})
		return rdb, func() { _ = rdb.Close(); m.Close() }, nil
	}
	opts, err := redis.ParseURL(c.redisURL)
	if err != nil {
		return nil, nil, fmt.Errorf("--redis-url: %w", errors.New(redactURL(err.Error(), c.redisURL)))
	}
	opts.DisableIdentity = true
	// A caller's gRPC deadline bounds its Redis call too.
	opts.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opts)
	log.Info("using Redis", "addr", opts.Addr, "db", opts.DB, "tls", opts.TLSConfig != nil)
	return rdb, func() { _ = rdb.Close() }, nil
}

// redisLogger sends go-redis's own messages (reconnects, pool trouble) to the
// JSON log instead of plain lines on stderr.
type redisLogger struct{ log *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.log.WarnContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}

// redactURL removes the URL's password from a message.
func redactURL(msg, raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log, err := newLogger(c.logLevel, stderr)
	if err != nil {
		return err
	}
	redis.SetLogger(redisLogger{log})
	if err := checkLoopback(c.listen); err != nil {
		return err
	}
	policies := ledger.DefaultPolicies()
	if c.policy != "" {
		if policies, err = ledger.LoadPolicies(c.policy); err != nil {
			return err
		}
	}
	rdb, closeStore, err := openStore(c, log, stderr)
	if err != nil {
		return err
	}
	defer closeStore()

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	l, err := ledger.New(rdb, ledger.Options{Prefix: c.prefix, Policies: policies, Logger: log})
	if err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = l.LoadScripts(startCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("cannot use the store: %w", err)
	}

	lis, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	svc := server.New(server.Config{Ledger: l, Logger: log})
	log.Info("ledgerd serving", "listen", lis.Addr().String(), "key_prefix", c.prefix, "policy", c.policy)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return svc.Serve(lis) })
	g.Go(func() error { l.RunSweeper(gctx, c.sweepInterval); return nil })
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down")
		sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
		defer cancel()
		svc.Shutdown(sctx)
		return nil
	})
	if err := g.Wait(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	log.Info("stopped")
	return nil
}
