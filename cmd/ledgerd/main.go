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
	d, err := configure(args, stderr, tune)
	if d == nil {
		return err
	}
	// SIGHUP is caught from here on, so that one sent while ledgerd starts
	// (connecting to Redis may take a while) is not its default action,
	// which ends the process: the reload runs once ledgerd serves.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	policies, err := d.loadFiles()
	if err != nil {
		return err
	}
	rdb, closeStore, err := openStore(d.c, d.log, stderr)
	if err != nil {
		return err
	}
	defer closeStore()

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := d.openLedger(ctx, rdb, policies); err != nil {
		return err
	}
	shutdownTracing, traceOpt, err := startTracing(ctx, d.c)
	if err != nil {
		return err
	}
	defer shutdownTracing()
	if err := d.listen(); err != nil {
		return err
	}
	defer d.closeListeners()
	svc, api, err := d.newService(traceOpt)
	if err != nil {
		return err
	}
	return d.serve(ctx, svc, api, hup)
}

// daemon is what runTuned builds, one step after the other.
type daemon struct {
	c          config
	log        *slog.Logger
	auth       *server.Authenticator // nil without --auth-file
	tlsr       *server.TLSReloader   // nil without --tls-cert
	receipts   *receipt.Signer       // nil without --receipt-keys
	met        *metrics.Metrics
	l          *ledger.Ledger
	durability []ledger.DurabilityCheck

	lis, httpLis, metricsLis net.Listener // the last two nil when off
}

// configure reads the command line and the environment. It returns a nil
// daemon and a nil error for -h, and a usageError for what it refuses.
func configure(args []string, stderr io.Writer, tune func(*config)) (*daemon, error) {
	c, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil
		}
		return nil, err
	}
	if tune != nil {
		tune(&c)
	}
	log, err := newLogger(c.logLevel, stderr)
	if err != nil {
		return nil, usage(err)
	}
	redis.SetLogger(redisLogger{log})
	if err := checkListen(c); err != nil {
		return nil, usage(err)
	}
	return &daemon{c: c, log: log}, nil
}

// loadFiles loads the credentials, TLS, receipt key and policy files the
// configuration names, and returns the policies.
func (d *daemon) loadFiles() (*ledger.Policies, error) {
	if d.c.authFile != "" {
		creds, err := server.LoadCredentials(d.c.authFile)
		if err != nil {
			return nil, err
		}
		d.auth = server.NewAuthenticator(creds)
	}
	if d.c.tls.Cert != "" {
		tlsr, err := server.NewTLSReloader(d.c.tls)
		if err != nil {
			return nil, err
		}
		d.tlsr = tlsr
	}
	receipts, err := startReceipts(d.c, d.log)
	if err != nil {
		return nil, err
	}
	d.receipts = receipts
	if d.c.policy == "" {
		return ledger.DefaultPolicies(), nil
	}
	return ledger.LoadPolicies(d.c.policy)
}

// openLedger checks the store's durability settings, builds the ledger
// and its metrics on rdb, and loads its scripts.
func (d *daemon) openLedger(ctx context.Context, rdb redis.UniversalClient, policies *ledger.Policies) error {
	var err error
	if d.durability, err = checkDurability(ctx, d.c, rdb, d.log); err != nil {
		return err
	}
	d.met = metrics.New(metrics.Options{TenantLabel: d.c.tenantLabel})
	d.l, err = ledger.New(rdb, ledger.Options{Prefix: d.c.prefix, Policies: policies, Logger: d.log,
		UnresolvedLimit: d.unresolvedLimit, Observer: d.met.Observe,
		WaitReplicas: d.c.waitReplicas, WaitTimeout: d.c.waitTimeout, NoFunctions: !d.c.functions})
	if err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = d.l.LoadScripts(startCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("cannot use the store: %w", err)
	}
	if limit, ok := openFileLimit(); ok {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		checkOpenFiles(d.log, d.c.conns.MaxConnections, redisConnections(cctx, d.c, rdb), limit)
		cancel()
	}
	return nil
}

// unresolvedLimit is the unresolved operations tenant may hold: its own
// limit from the credentials file, else --max-unresolved.
func (d *daemon) unresolvedLimit(tenant string) int {
	if d.auth != nil {
		if n := d.auth.Credentials().Limits(tenant).MaxUnresolved; n > 0 {
			return n
		}
	}
	return d.c.maxUnresolved
}

// listen binds every address ledgerd serves before any of them serves, so
// an address it cannot have stops the start with nothing served.
func (d *daemon) listen() error {
	var err error
	if d.lis, err = listenChecked(d.c, "--listen", d.c.listen); err != nil {
		return err
	}
	if d.c.httpListen != "" {
		if d.httpLis, err = listenChecked(d.c, "--http-listen", d.c.httpListen); err != nil {
			d.closeListeners()
			return err
		}
	}
	if d.c.metricsListen != "" {
		if d.metricsLis, err = net.Listen("tcp", d.c.metricsListen); err != nil {
			d.closeListeners()
			return fmt.Errorf("--metrics-listen: %w", err)
		}
	}
	return nil
}

// listenChecked listens on addr, the address of flag, and refuses where it
// bound an address checkListen's rules do not allow.
func listenChecked(c config, flag, addr string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if err := checkBoundAs(c, flag, addr, lis.Addr()); err != nil {
		_ = lis.Close()
		return nil, err
	}
	return lis, nil
}

// closeListeners closes the listeners listen opened; those already closed
// by their servers are left as they are.
func (d *daemon) closeListeners() {
	for _, l := range []net.Listener{d.lis, d.httpLis, d.metricsLis} {
		if l != nil {
			_ = l.Close()
		}
	}
}

// newService builds the gRPC service, and the HTTP API in front of it when
// --http-listen is set (nil otherwise), and has the metrics follow them.
func (d *daemon) newService(traceOpt grpc.ServerOption) (*server.Service, *httpAPI, error) {
	opts := d.met.ServerOptions()
	var tlsCfg *tls.Config
	if d.tlsr != nil {
		tlsCfg = d.tlsr.Config()
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	if traceOpt != nil {
		opts = append(opts, traceOpt)
	}
	svc := server.New(server.Config{
		Ledger: d.l, Logger: d.log, Auth: d.auth, PublicReflection: d.c.publicReflection,
		Rate: d.c.rate, Burst: d.c.burst, Connections: d.c.conns, Receipts: d.receipts,
	}, opts...)
	var api *httpAPI
	if d.httpLis != nil {
		var err error
		o := httpOptions{receipts: d.receipts, tls: tlsCfg, anonymous: d.auth == nil, readTimeout: d.c.httpReadTimeout,
			idleTimeout: d.c.httpIdleTimeout}
		if api, err = newHTTPAPI(d.httpLis, o, d.log); err != nil {
			return nil, nil, err
		}
	}
	d.watch(svc)
	return svc, api, nil
}

// watch has the metrics follow the service, the store's durability and the
// files loaded.
func (d *daemon) watch(svc *server.Service) {
	d.met.InitializeRPC(svc.GRPC)
	d.met.WatchStore(d.l, 0)
	d.met.WatchConnections(func() (int, uint64) { s := svc.Connections(); return s.Open, s.Refused })
	d.met.WatchHealthWatches(func() (int, uint64) { s := svc.HealthWatches(); return s.Open, s.Refused })
	for _, c := range d.durability {
		d.met.SetDurability(c.Name, c.OK)
	}
	if d.auth != nil {
		d.met.SetReloaded("credentials", true)
	}
	if d.tlsr != nil {
		d.met.SetReloaded("tls", true)
		d.met.SetCertificateExpiry(d.tlsr.NotAfter())
	}
}

// serve serves svc, the HTTP API and the metrics, and runs the ledger's
// background work, until ctx ends or one of them fails; then it shuts
// them down.
func (d *daemon) serve(ctx context.Context, svc *server.Service, api *httpAPI, hup <-chan os.Signal) error {
	d.log.Info("ledgerd serving", "listen", d.lis.Addr().String(), "key_prefix", d.c.prefix, "policy", d.c.policy,
		"auth", d.auth != nil, "tls", d.tlsr != nil, "mtls", d.c.tls.ClientCA != "", "tracing", d.c.otlpEndpoint != "")
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		// A stop that came before Serve began leaves it nothing to serve:
		// that is the stop asked for, not a failure.
		if err := svc.Serve(d.lis); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	if api != nil {
		g.Go(func() error { return api.serve(gctx, svc, d.c.shutdownTimeout, d.log) })
	}
	if d.metricsLis != nil {
		d.serveMetrics(gctx, g)
	}
	g.Go(func() error { reloadOnHangup(gctx, hup, d.c, d.auth, d.tlsr, d.met, d.log); return nil })
	g.Go(func() error { d.l.RunSweeper(gctx, d.c.sweepInterval); return nil })
	if d.c.redisURL != "" {
		g.Go(func() error { watchDurability(gctx, d.l, d.met, d.log, d.durability, d.c.durabilityEvery); return nil })
	}
	if d.c.compactBatch > 0 {
		g.Go(func() error { d.l.RunCompactor(gctx, ledger.DefaultCompactInterval, d.c.compactBatch); return nil })
	}
	g.Go(func() error {
		<-gctx.Done()
		d.log.Info("shutting down")
		sctx, cancel := context.WithTimeout(context.Background(), d.c.shutdownTimeout)
		defer cancel()
		svc.Shutdown(sctx)
		return nil
	})
	if err := g.Wait(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	d.log.Info("stopped")
	return nil
}

// serveMetrics serves /metrics (and the receipt keys, when receipts are
// on) on the metrics listener in g until ctx ends.
func (d *daemon) serveMetrics(ctx context.Context, g *errgroup.Group) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", d.met.Handler())
	if d.receipts != nil {
		mux.Handle("GET "+receipt.JWKSPath, d.receipts.JWKSHandler())
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: d.c.httpIdleTimeout,
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	d.log.Info("metrics serving", "listen", d.metricsLis.Addr().String())
	g.Go(func() error {
		if err := hs.Serve(d.metricsLis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), d.c.shutdownTimeout)
		defer cancel()
		return hs.Shutdown(sctx)
	})
}
