// Command ledgerd runs the operation ledger: the gRPC service
// ledger.v1.LedgerService, with health and reflection, on Redis.
//
// With no Redis configured it runs on an embedded in-process engine, for
// trying it out: nothing survives a restart. Configuration comes from flags,
// or from the environment when a flag is not given:
//
//	--listen            LEDGER_LISTEN            host:port to serve (127.0.0.1:50051); loopback unless --auth-file and TLS
//	--redis-url         LEDGER_REDIS_URL         redis://[user:password@]host:port/db, rediss:// for TLS
//	--redis-ca          LEDGER_REDIS_CA          CA of Redis's certificate (PEM), for rediss:// with a private CA
//	--redis-mode        LEDGER_REDIS_MODE        single, cluster (?addr=... seeds) or sentinel (?master_name=...) (single)
//	--wait-replicas     LEDGER_WAIT_REPLICAS     replicas every write and Lookup waits for (WAIT); 0: none
//	--wait-timeout      LEDGER_WAIT_TIMEOUT      how long a call waits for them (100ms)
//	--redis-autopipeline LEDGER_REDIS_AUTOPIPELINE batch concurrent scripts into pipelines (true)
//	--redis-functions   LEDGER_REDIS_FUNCTIONS   run the scripts as Redis Functions where the store has them (true)
//	--policy            LEDGER_POLICY            policy file (YAML or JSON); defaults when absent
//	--key-prefix        LEDGER_KEY_PREFIX        first segment of every Redis key (ledger)
//	--sweep-interval    LEDGER_SWEEP_INTERVAL    how often expired leases are swept (1s)
//	--compact-batch     LEDGER_COMPACT_BATCH     keys per master and second the compaction pass looks at (250; 0: off)
//	--log-level         LEDGER_LOG_LEVEL         debug, info, warn or error (info)
//	--shutdown-timeout  LEDGER_SHUTDOWN_TIMEOUT  how long running calls may finish at shutdown (10s)
//	--auth-file         LEDGER_AUTH_FILE         credentials file: API keys, client certificates, tenant limits
//	--tls-cert          LEDGER_TLS_CERT          server certificate chain (PEM)
//	--tls-key           LEDGER_TLS_KEY           server key (PEM)
//	--tls-client-ca     LEDGER_TLS_CLIENT_CA     CA of client certificates (mTLS)
//	--public-reflection LEDGER_PUBLIC_REFLECTION serve reflection without credentials (false)
//	--rate-limit        LEDGER_RATE_LIMIT        calls per second per tenant (0: no limit)
//	--rate-burst        LEDGER_RATE_BURST        calls at once per tenant (the rate, rounded up)
//	--max-unresolved    LEDGER_MAX_UNRESOLVED    unresolved operations a tenant may hold (100000; 0: no limit)
//	--allow-plaintext   LEDGER_ALLOW_PLAINTEXT   serve a non-loopback address without TLS (false)
//	--http-listen       LEDGER_HTTP_LISTEN       host:port of the HTTP/JSON API, rules as --listen (off when empty)
//	--receipt-keys      LEDGER_RECEIPT_KEYS      JWK files of the Ed25519 receipt keys, the first signs (off when empty)
//	--receipt-issuer    LEDGER_RECEIPT_ISSUER    the issuer id receipts name (ledgerd)
//	--metrics-listen    LEDGER_METRICS_LISTEN    address of the Prometheus /metrics listener (off when empty)
//	--metrics-tenant-label LEDGER_METRICS_TENANT_LABEL  add a tenant label to the ledger metrics (false)
//	--otlp-endpoint     LEDGER_OTLP_ENDPOINT     OTLP/gRPC collector for traces, host:port (off when empty)
//	--otlp-insecure     LEDGER_OTLP_INSECURE     send traces without TLS (false)
//	--require-durable   LEDGER_REQUIRE_DURABLE   refuse to start unless Redis keeps acknowledged records (false)
//	--handshake-timeout LEDGER_HANDSHAKE_TIMEOUT how long a new connection may take to finish its handshakes (10s)
//	--max-connection-idle LEDGER_MAX_CONNECTION_IDLE close a connection without calls for that long (5m)
//	--keepalive-time    LEDGER_KEEPALIVE_TIME    ping a client silent for that long (1m)
//	--keepalive-timeout LEDGER_KEEPALIVE_TIMEOUT close its connection when the ping is not answered by then (20s)
//	--max-concurrent-streams LEDGER_MAX_CONCURRENT_STREAMS calls one connection may run at once (1000)
//	--max-connections   LEDGER_MAX_CONNECTIONS   client connections open at once; more are refused (10000; 0: no limit)
//	--max-connection-age LEDGER_MAX_CONNECTION_AGE send GOAWAY to a connection that has lived that long (30m; 0: never)
//	--max-connection-age-grace LEDGER_MAX_CONNECTION_AGE_GRACE how long its running calls may take to finish (1m)
//	--max-health-watches LEDGER_MAX_HEALTH_WATCHES health Watch streams open at once; more are refused (2000; 0: no limit)
//
// On Linux it warns at start when the open-file limit cannot hold
// --max-connections, its Redis connections and a margin (raise ulimit -n,
// or lower --max-connections; docs/configuration.md).
//
// Without --auth-file every caller is the tenant "default" and ledgerd only
// serves a loopback address; with it, every call but health checks needs an
// API key or a mapped client certificate, and a non-loopback address also
// needs TLS (or --allow-plaintext behind a TLS-terminating proxy).
//
// It reloads the credentials file and the TLS files on SIGHUP, without
// dropping connections. It stops on SIGINT or SIGTERM: health turns
// NOT_SERVING, running calls finish (up to --shutdown-timeout), then it
// exits.
//
// "ledgerd keygen --id ID --tenant T --scopes agent" prints a new API key and
// the line of the credentials file that admits it.
//
// Exit status: 0 after a stop asked for (and for -h), 1 for a failure at run
// time (a file, Redis, the listen address), 2 for a usage error (an unknown
// flag, a value or a combination of flags it refuses, a stray argument), in
// ledgerd and ledgerd keygen alike.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/opledger/ledger/internal/gogc"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/metrics"
	"github.com/opledger/ledger/receipt"
	"github.com/opledger/ledger/server"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "keygen" {
		if err := keygen(os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "ledgerd:", err)
			os.Exit(2)
		}
		return
	}
	gogc.Tune(os.Getenv)
	if err := run(context.Background(), os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ledgerd:", err)
		var u *usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a command line (or environment) ledgerd refuses before it
// starts anything: an unknown flag, a value it does not take, flags it does
// not take together, a stray argument. main exits 2 for it, as the flag
// package does, and 1 for a failure at run time.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }

func (e *usageError) Unwrap() error { return e.err }

// usage marks err, when there is one, as a usageError.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{err}
}

// reloadOnHangup reloads the credentials and TLS files on each SIGHUP hup
// delivers. A file that fails to load leaves the previous one in force.
func reloadOnHangup(ctx context.Context, hup <-chan os.Signal, c config, auth *server.Authenticator, tlsr *server.TLSReloader, met *metrics.Metrics, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if auth != nil {
			creds, err := server.LoadCredentials(c.authFile)
			if err != nil {
				log.Error("reload: the credentials file did not load; the previous one stays", "error", err)
			} else {
				auth.Reload(creds)
				log.Info("reload: credentials file loaded", "file", c.authFile)
			}
			met.SetReloaded("credentials", err == nil)
		}
		if tlsr != nil {
			err := tlsr.Reload()
			if err != nil {
				log.Error("reload: the TLS files did not load; the previous ones stay", "error", err)
			} else {
				log.Info("reload: TLS files loaded", "not_after", tlsr.NotAfter().UTC().Format(time.RFC3339))
				met.SetCertificateExpiry(tlsr.NotAfter())
			}
			met.SetReloaded("tls", err == nil)
		}
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	return runTuned(ctx, args, stderr, nil)
}

// runTuned is run with tune applied to the configuration the flags give
// (the tests shorten what no flag sets).
func runTuned(ctx context.Context, args []string, stderr io.Writer, tune func(*config)) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if tune != nil {
		tune(&c)
	}
	log, err := newLogger(c.logLevel, stderr)
	if err != nil {
		return usage(err)
	}
	redis.SetLogger(redisLogger{log})
	if err := checkListen(c); err != nil {
		return usage(err)
	}
	// SIGHUP is caught from here on, so that one sent while ledgerd starts
	// (connecting to Redis may take a while) is not its default action,
	// which ends the process: the reload runs once ledgerd serves.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var (
		auth  *server.Authenticator
		creds = &server.Credentials{}
		tlsr  *server.TLSReloader
	)
	if c.authFile != "" {
		if creds, err = server.LoadCredentials(c.authFile); err != nil {
			return err
		}
		auth = server.NewAuthenticator(creds)
	}
	if c.tls.Cert != "" {
		if tlsr, err = server.NewTLSReloader(c.tls); err != nil {
			return err
		}
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

	durability, err := checkDurability(ctx, c, rdb, log)
	if err != nil {
		return err
	}
	met := metrics.New(metrics.Options{TenantLabel: c.tenantLabel})
	unresolvedLimit := func(tenant string) int {
		if auth != nil {
			if n := auth.Credentials().Limits(tenant).MaxUnresolved; n > 0 {
				return n
			}
		}
		return c.maxUnresolved
	}
	l, err := ledger.New(rdb, ledger.Options{Prefix: c.prefix, Policies: policies, Logger: log,
		UnresolvedLimit: unresolvedLimit, Observer: met.Observe,
		WaitReplicas: c.waitReplicas, WaitTimeout: c.waitTimeout, NoFunctions: !c.functions})
	if err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = l.LoadScripts(startCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("cannot use the store: %w", err)
	}
	if limit, ok := openFileLimit(); ok {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		checkOpenFiles(log, c.conns.MaxConnections, redisConnections(cctx, c, rdb), limit)
		cancel()
	}

	lis, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	if err := checkBound(c, lis.Addr()); err != nil {
		_ = lis.Close()
		return err
	}
	opts := met.ServerOptions()
	if tlsr != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsr.Config())))
	}
	shutdownTracing, traceOpt, err := startTracing(ctx, c)
	if err != nil {
		return err
	}
	defer shutdownTracing()
	if traceOpt != nil {
		opts = append(opts, traceOpt)
	}
	receipts, err := startReceipts(c, log)
	if err != nil {
		return err
	}
	svc := server.New(server.Config{
		Ledger: l, Logger: log, Auth: auth, PublicReflection: c.publicReflection,
		Rate: c.rate, Burst: c.burst, Connections: c.conns, Receipts: receipts,
	}, opts...)
	met.InitializeRPC(svc.GRPC)
	met.WatchStore(l, 0)
	met.WatchConnections(func() (int, uint64) { s := svc.Connections(); return s.Open, s.Refused })
	met.WatchHealthWatches(func() (int, uint64) { s := svc.HealthWatches(); return s.Open, s.Refused })
	for _, d := range durability {
		met.SetDurability(d.Name, d.OK)
	}
	if auth != nil {
		met.SetReloaded("credentials", true)
	}
	if tlsr != nil {
		met.SetReloaded("tls", true)
		met.SetCertificateExpiry(tlsr.NotAfter())
	}
	log.Info("ledgerd serving", "listen", lis.Addr().String(), "key_prefix", c.prefix, "policy", c.policy,
		"auth", auth != nil, "tls", tlsr != nil, "mtls", c.tls.ClientCA != "", "tracing", traceOpt != nil)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		// A stop that came before Serve began leaves it nothing to serve:
		// that is the stop asked for, not a failure.
		if err := svc.Serve(lis); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	var tlsCfg *tls.Config
	if tlsr != nil {
		tlsCfg = tlsr.Config()
	}
	api, err := startHTTP(c, svc, receipts, tlsCfg, log)
	if err != nil {
		return err
	}
	if api != nil {
		g.Go(func() error { return api.serve(gctx, svc, c.shutdownTimeout, log) })
	}
	if c.metricsListen != "" {
		mlis, err := net.Listen("tcp", c.metricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", met.Handler())
		if receipts != nil {
			mux.Handle("GET "+receipt.JWKSPath, receipts.JWKSHandler())
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		log.Info("metrics serving", "listen", mlis.Addr().String())
		g.Go(func() error {
			if err := hs.Serve(mlis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
			defer cancel()
			return hs.Shutdown(sctx)
		})
	}
	g.Go(func() error { reloadOnHangup(gctx, hup, c, auth, tlsr, met, log); return nil })
	g.Go(func() error { l.RunSweeper(gctx, c.sweepInterval); return nil })
	if c.redisURL != "" {
		g.Go(func() error { watchDurability(gctx, l, met, log, durability, c.durabilityEvery); return nil })
	}
	if c.compactBatch > 0 {
		g.Go(func() error { l.RunCompactor(gctx, ledger.DefaultCompactInterval, c.compactBatch); return nil })
	}
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
