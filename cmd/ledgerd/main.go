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
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/opledger/ledger/internal/redisconf"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/metrics"
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
	tuneGC(os.Getenv)
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

// DefaultGCPercent is ledgerd's garbage collection target (GOGC) unless
// the environment sets GOGC. ledgerd's live heap is a few MB and every call
// allocates a few KB, so Go's default of 100 collects several times a
// second under load; at 400 ledgerd spends about a sixth less CPU per
// Reserve, for a heap of at most five times the live one
// (docs/benchmarks.md §6.4).
const DefaultGCPercent = 400

// tuneGC sets DefaultGCPercent unless GOGC is set (getenv is os.Getenv).
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(DefaultGCPercent)
	}
}

type config struct {
	listen          string
	redisURL        string
	policy          string
	prefix          string
	sweepInterval   time.Duration
	compactBatch    int
	shutdownTimeout time.Duration
	logLevel        string

	authFile         string
	tls              server.TLSFiles
	publicReflection bool
	rate             float64
	burst            int
	maxUnresolved    int
	allowPlaintext   bool
	redisCA          string

	redisMode    string
	waitReplicas int
	waitTimeout  time.Duration
	// autopipeline batches concurrent scripts (internal/autopipe).
	autopipeline bool

	metricsListen  string
	tenantLabel    bool
	otlpEndpoint   string
	otlpInsecure   bool
	requireDurable bool

	// conns bounds each client connection.
	conns server.ConnectionLimits
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// parseFlags reads the command line and the environment into a config. Its
// errors but flag.ErrHelp (-h) are usageErrors.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs, finish := newFlagSet(&c, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, usage(err)
	}
	return c, usage(finish())
}

// newFlagSet defines ledgerd's flags on a new flag set that fills c. Each
// flag's usage ends with the environment variable that is its default when
// set ("[LEDGER_LISTEN]"). finish checks the values, and converts those
// read as text into c, once the flag set has parsed the command line.
func newFlagSet(c *config, stderr io.Writer) (fs *flag.FlagSet, finish func() error) {
	fs = flag.NewFlagSet("ledgerd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.listen, "listen", env("LEDGER_LISTEN", "127.0.0.1:50051"), "host:port to serve gRPC on: loopback, or with --auth-file and TLS (or --allow-plaintext) any address [LEDGER_LISTEN]")
	fs.StringVar(&c.redisURL, "redis-url", env("LEDGER_REDIS_URL", ""), "Redis URL, e.g. redis://127.0.0.1:6379/0; empty runs the embedded engine (nothing survives a restart) [LEDGER_REDIS_URL]")
	fs.StringVar(&c.policy, "policy", env("LEDGER_POLICY", ""), "policy file (YAML or JSON); empty uses the defaults [LEDGER_POLICY]")
	fs.StringVar(&c.prefix, "key-prefix", env("LEDGER_KEY_PREFIX", ledger.DefaultPrefix), "first segment of every Redis key [LEDGER_KEY_PREFIX]")
	fs.StringVar(&c.logLevel, "log-level", env("LEDGER_LOG_LEVEL", "info"), "debug, info, warn or error [LEDGER_LOG_LEVEL]")
	sweep := fs.String("sweep-interval", env("LEDGER_SWEEP_INTERVAL", ledger.DefaultSweepInterval.String()), "how often expired leases are swept [LEDGER_SWEEP_INTERVAL]")
	compactBatch := fs.String("compact-batch", env("LEDGER_COMPACT_BATCH", strconv.Itoa(ledger.DefaultCompactBatch)), "record keys per Redis master the compaction pass looks at each second, cutting terminal records past their retention to their tombstone; 0: off [LEDGER_COMPACT_BATCH]")
	shutdown := fs.String("shutdown-timeout", env("LEDGER_SHUTDOWN_TIMEOUT", "10s"), "how long running calls may take to finish at shutdown [LEDGER_SHUTDOWN_TIMEOUT]")
	fs.StringVar(&c.redisMode, "redis-mode", env("LEDGER_REDIS_MODE", "single"), "single, cluster (Redis Cluster: --redis-url lists seed nodes as ?addr=host:port) or sentinel (?master_name=NAME) [LEDGER_REDIS_MODE]")
	waitReplicas := fs.String("wait-replicas", env("LEDGER_WAIT_REPLICAS", "0"), "replicas every write and Lookup waits for (WAIT); 0: none [LEDGER_WAIT_REPLICAS]")
	waitTimeout := fs.String("wait-timeout", env("LEDGER_WAIT_TIMEOUT", "100ms"), "how long a call waits for its replicas [LEDGER_WAIT_TIMEOUT]")
	fs.StringVar(&c.redisCA, "redis-ca", env("LEDGER_REDIS_CA", ""), "CA of the Redis server's certificate, PEM, for a rediss:// URL with a private CA [LEDGER_REDIS_CA]")
	fs.StringVar(&c.authFile, "auth-file", env("LEDGER_AUTH_FILE", ""), "credentials file (API keys, client certificates, tenant limits); empty: no authentication, loopback only [LEDGER_AUTH_FILE]")
	fs.StringVar(&c.tls.Cert, "tls-cert", env("LEDGER_TLS_CERT", ""), "server certificate chain, PEM [LEDGER_TLS_CERT]")
	fs.StringVar(&c.tls.Key, "tls-key", env("LEDGER_TLS_KEY", ""), "server private key, PEM [LEDGER_TLS_KEY]")
	fs.StringVar(&c.tls.ClientCA, "tls-client-ca", env("LEDGER_TLS_CLIENT_CA", ""), "CA of client certificates, PEM: enables mTLS [LEDGER_TLS_CLIENT_CA]")
	var envErr error
	boolFlag := func(dst *bool, name, envName, usage string) {
		def := false
		if v, ok := os.LookupEnv(envName); ok {
			b, err := strconv.ParseBool(v)
			if err != nil && envErr == nil {
				envErr = fmt.Errorf("%s=%q: want true or false", envName, v)
			}
			def = b
		}
		fs.BoolVar(dst, name, def, usage+" ["+envName+"]")
	}
	boolFlag(&c.publicReflection, "public-reflection", "LEDGER_PUBLIC_REFLECTION", "serve reflection to callers without credentials")
	rateLimit := fs.String("rate-limit", env("LEDGER_RATE_LIMIT", "0"), "calls per second per tenant; 0: no limit [LEDGER_RATE_LIMIT]")
	rateBurst := fs.String("rate-burst", env("LEDGER_RATE_BURST", "0"), "calls at once per tenant; 0: the rate, rounded up [LEDGER_RATE_BURST]")
	maxUnresolved := fs.String("max-unresolved", env("LEDGER_MAX_UNRESOLVED", "100000"), "unresolved operations a tenant may hold; 0: no limit [LEDGER_MAX_UNRESOLVED]")
	boolFlag(&c.allowPlaintext, "allow-plaintext", "LEDGER_ALLOW_PLAINTEXT", "serve a non-loopback address without TLS, e.g. behind a TLS-terminating proxy")
	fs.StringVar(&c.metricsListen, "metrics-listen", env("LEDGER_METRICS_LISTEN", ""), "address of the Prometheus /metrics listener, e.g. 127.0.0.1:9464; empty: off [LEDGER_METRICS_LISTEN]")
	boolFlag(&c.tenantLabel, "metrics-tenant-label", "LEDGER_METRICS_TENANT_LABEL", "add a tenant label to the ledger metrics")
	fs.StringVar(&c.otlpEndpoint, "otlp-endpoint", env("LEDGER_OTLP_ENDPOINT", ""), "OTLP/gRPC trace collector, host:port; empty: no tracing [LEDGER_OTLP_ENDPOINT]")
	boolFlag(&c.otlpInsecure, "otlp-insecure", "LEDGER_OTLP_INSECURE", "send traces without TLS")
	boolFlag(&c.requireDurable, "require-durable", "LEDGER_REQUIRE_DURABLE", "refuse to start unless Redis has appendonly yes, appendfsync always and maxmemory-policy noeviction")
	handshakeTimeout := fs.String("handshake-timeout", env("LEDGER_HANDSHAKE_TIMEOUT", "10s"), "how long a new connection may take to finish its TLS and HTTP/2 handshakes [LEDGER_HANDSHAKE_TIMEOUT]")
	maxConnIdle := fs.String("max-connection-idle", env("LEDGER_MAX_CONNECTION_IDLE", "5m"), "close (GOAWAY) a connection without calls for that long; clients reconnect on their next call [LEDGER_MAX_CONNECTION_IDLE]")
	keepaliveTime := fs.String("keepalive-time", env("LEDGER_KEEPALIVE_TIME", "1m"), "ping a client after that long without a frame from it; at least 1s [LEDGER_KEEPALIVE_TIME]")
	keepaliveTimeout := fs.String("keepalive-timeout", env("LEDGER_KEEPALIVE_TIMEOUT", "20s"), "close the connection when that ping is not answered within that long [LEDGER_KEEPALIVE_TIMEOUT]")
	maxStreams := fs.String("max-concurrent-streams", env("LEDGER_MAX_CONCURRENT_STREAMS", strconv.Itoa(server.DefaultMaxConcurrentStreams)), "calls one connection may run at once; the client holds further ones until one ends [LEDGER_MAX_CONCURRENT_STREAMS]")
	maxConnAge := fs.String("max-connection-age", env("LEDGER_MAX_CONNECTION_AGE", "30m"), "send GOAWAY to a connection that has lived that long (give or take 10%), so that clients spread over new instances; 0: never [LEDGER_MAX_CONNECTION_AGE]")
	maxConnAgeGrace := fs.String("max-connection-age-grace", env("LEDGER_MAX_CONNECTION_AGE_GRACE", "1m"), "how long the calls running at that GOAWAY may take to finish before the connection is closed [LEDGER_MAX_CONNECTION_AGE_GRACE]")
	maxConns := fs.String("max-connections", env("LEDGER_MAX_CONNECTIONS", strconv.Itoa(server.DefaultMaxConnections)), "client connections open at once; one more is closed as soon as it is accepted (its client sees UNAVAILABLE); 0: no limit [LEDGER_MAX_CONNECTIONS]")
	maxWatches := fs.String("max-health-watches", env("LEDGER_MAX_HEALTH_WATCHES", strconv.Itoa(server.DefaultMaxHealthWatches)), "grpc.health.v1.Health/Watch streams open at once, over all connections; one more is answered RESOURCE_EXHAUSTED at once (Check is not bounded); 0: no limit [LEDGER_MAX_HEALTH_WATCHES]")
	autopipeline := true
	if v, ok := os.LookupEnv("LEDGER_REDIS_AUTOPIPELINE"); ok {
		b, err := strconv.ParseBool(v)
		if err != nil && envErr == nil {
			envErr = fmt.Errorf("LEDGER_REDIS_AUTOPIPELINE=%q: want true or false", v)
		}
		autopipeline = b
	}
	fs.BoolVar(&c.autopipeline, "redis-autopipeline", autopipeline, "send the scripts of concurrent calls to Redis in shared pipelines (docs/benchmarks.md); false: one round trip each [LEDGER_REDIS_AUTOPIPELINE]")
	return fs, func() error {
		if envErr != nil {
			return envErr
		}
		var err error
		if c.rate, err = strconv.ParseFloat(*rateLimit, 64); err != nil || !(c.rate >= 0) || math.IsInf(c.rate, 0) {
			return fmt.Errorf("--rate-limit %q: want a finite number of calls per second, 0 for no limit", *rateLimit)
		}
		if c.burst, err = strconv.Atoi(*rateBurst); err != nil || c.burst < 0 {
			return fmt.Errorf("--rate-burst %q: want a count, 0 for the rate", *rateBurst)
		}
		if c.waitReplicas, err = strconv.Atoi(*waitReplicas); err != nil || c.waitReplicas < 0 {
			return fmt.Errorf("--wait-replicas %q: want a count, 0 for none", *waitReplicas)
		}
		if c.waitTimeout, err = time.ParseDuration(*waitTimeout); err != nil || c.waitTimeout <= 0 {
			return fmt.Errorf("--wait-timeout %q: want a positive duration like 100ms", *waitTimeout)
		}
		if !slices.Contains(redisModes, c.redisMode) {
			return fmt.Errorf("--redis-mode %q: want single, cluster or sentinel", c.redisMode)
		}
		// The embedded engine would ignore these, or fail every call on
		// them: a setting meant for Redis without --redis-url is a mistake.
		if c.redisURL == "" && c.waitReplicas > 0 {
			return fmt.Errorf("--wait-replicas %d: the embedded engine has no replicas (set --redis-url)", c.waitReplicas)
		}
		if c.redisURL == "" && c.redisCA != "" {
			return errors.New("--redis-ca needs a rediss:// URL (--redis-url); the embedded engine speaks no TLS")
		}
		if c.redisURL == "" && c.redisMode != "single" {
			return fmt.Errorf("--redis-mode %s needs a Redis URL (set --redis-url); the embedded engine is a single node", c.redisMode)
		}
		if c.maxUnresolved, err = strconv.Atoi(*maxUnresolved); err != nil || c.maxUnresolved < 0 {
			return fmt.Errorf("--max-unresolved %q: want a count, 0 for no limit", *maxUnresolved)
		}
		if c.compactBatch, err = strconv.Atoi(*compactBatch); err != nil || c.compactBatch < 0 || c.compactBatch > maxCompactBatch {
			return fmt.Errorf("--compact-batch %q: want a count of keys up to %d, 0 for no compaction", *compactBatch, maxCompactBatch)
		}
		if err := parseConnectionLimits(&c.conns, connectionFlags{handshake: *handshakeTimeout, idle: *maxConnIdle,
			keepaliveTime: *keepaliveTime, keepaliveTimeout: *keepaliveTimeout, streams: *maxStreams, conns: *maxConns,
			age: *maxConnAge, ageGrace: *maxConnAgeGrace, watches: *maxWatches}); err != nil {
			return err
		}
		if err := ledger.CheckPrefix(c.prefix); err != nil {
			return fmt.Errorf("--key-prefix %q: want letters, digits, '.', '_' and '-' only", c.prefix)
		}
		if (c.tls.Cert == "") != (c.tls.Key == "") {
			return errors.New("--tls-cert and --tls-key go together")
		}
		if c.tls.ClientCA != "" && c.tls.Cert == "" {
			return errors.New("--tls-client-ca needs --tls-cert and --tls-key")
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("unexpected arguments %v: ledgerd takes flags only (--name value, or --name=value)", fs.Args())
		}
		if c.metricsListen != "" {
			if _, _, err := net.SplitHostPort(c.metricsListen); err != nil {
				return fmt.Errorf("--metrics-listen %q: want HOST:PORT, e.g. 127.0.0.1:9464 (%v)", c.metricsListen, err)
			}
		}
		if c.otlpEndpoint != "" {
			// The exporter would take anything, and send every span
			// nowhere (a HOST alone to port 443).
			if h, _, err := net.SplitHostPort(c.otlpEndpoint); err != nil || h == "" {
				return fmt.Errorf("--otlp-endpoint %q: want HOST:PORT of the OTLP/gRPC collector, e.g. 127.0.0.1:4317 (no scheme)", c.otlpEndpoint)
			}
		}
		d, err := time.ParseDuration(*sweep)
		if err != nil || d <= 0 {
			return fmt.Errorf("--sweep-interval %q: want a positive duration like 1s", *sweep)
		}
		c.sweepInterval = d
		if c.shutdownTimeout, err = time.ParseDuration(*shutdown); err != nil || c.shutdownTimeout < 0 {
			return fmt.Errorf("--shutdown-timeout %q: want a duration like 10s", *shutdown)
		}
		return nil
	}
}

// connectionFlags are the connection limits' flags, as given.
type connectionFlags struct {
	handshake, idle, keepaliveTime, keepaliveTimeout, streams, conns, age, ageGrace, watches string
}

// parseConnectionLimits reads the connection limits' flags into l: each
// duration positive (--keepalive-time at least 1s, grpc-go's least;
// --max-connection-age 0 for never), the count of streams from 1 to
// 2^32-1, the counts of connections and health watches a count, 0 for no
// limit.
func parseConnectionLimits(l *server.ConnectionLimits, f connectionFlags) error {
	for _, d := range []struct {
		flag, value string
		min         time.Duration
		zero        bool // 0 is allowed: never
		dst         *time.Duration
	}{
		{"--handshake-timeout", f.handshake, 0, false, &l.HandshakeTimeout},
		{"--max-connection-idle", f.idle, 0, false, &l.MaxConnectionIdle},
		{"--keepalive-time", f.keepaliveTime, time.Second, false, &l.KeepaliveTime},
		{"--keepalive-timeout", f.keepaliveTimeout, 0, false, &l.KeepaliveTimeout},
		{"--max-connection-age", f.age, 0, true, &l.MaxConnectionAge},
		{"--max-connection-age-grace", f.ageGrace, 0, false, &l.MaxConnectionAgeGrace},
	} {
		v, err := time.ParseDuration(d.value)
		switch {
		case d.zero && err == nil && v == 0:
			v = -1 // server.ConnectionLimits: never
		case err != nil || v <= 0:
			if d.zero {
				return fmt.Errorf("%s %q: want a positive duration like 30m, or 0 for never", d.flag, d.value)
			}
			return fmt.Errorf("%s %q: want a positive duration like 10s or 5m", d.flag, d.value)
		case v < d.min:
			return fmt.Errorf("%s %q: want at least %s", d.flag, d.value, d.min)
		}
		*d.dst = v
	}
	n, err := strconv.ParseUint(f.streams, 10, 32)
	if err != nil || n == 0 {
		return fmt.Errorf("--max-concurrent-streams %q: want a count from 1 to %d", f.streams, uint32(math.MaxUint32))
	}
	l.MaxConcurrentStreams = uint32(n)
	m, err := strconv.Atoi(f.conns)
	switch {
	case err != nil || m < 0:
		return fmt.Errorf("--max-connections %q: want a count, 0 for no limit", f.conns)
	case m == 0:
		l.MaxConnections = -1 // server.ConnectionLimits: no bound
	default:
		l.MaxConnections = m
	}
	w, err := strconv.Atoi(f.watches)
	switch {
	case err != nil || w < 0:
		return fmt.Errorf("--max-health-watches %q: want a count, 0 for no limit", f.watches)
	case w == 0:
		l.MaxHealthWatches = -1 // server.ConnectionLimits: no bound
	default:
		l.MaxHealthWatches = w
	}
	return nil
}

// checkListen refuses to serve beyond this machine without authentication
// (any caller could read and write every operation), and without TLS (API
// keys would cross the network in clear) unless told otherwise. It judges
// the address as given, before anything starts; the name localhost passes
// here, and checkBound judges where it went.
func checkListen(c config) error {
	host, _, err := net.SplitHostPort(c.listen)
	if err != nil {
		return fmt.Errorf("--listen %q: want HOST:PORT, e.g. 127.0.0.1:50051 (%w)", c.listen, err)
	}
	if host == "localhost" {
		return nil
	}
	if err := listenRule(c, host); err != nil {
		return fmt.Errorf("--listen %q: %w", c.listen, err)
	}
	return nil
}

// checkBound applies checkListen's rules to the address the listener bound:
// a name is where the hosts file or the resolver says it is, and localhost
// need not be loopback there.
func checkBound(c config, bound net.Addr) error {
	host, _, err := net.SplitHostPort(bound.String())
	if err != nil {
		host = bound.String()
	}
	if err := listenRule(c, host); err != nil {
		return fmt.Errorf("--listen %q bound %s, which is not loopback: %w", c.listen, bound, err)
	}
	return nil
}

// listenRule is nil when ledgerd may serve on the IP address host (anything
// that is not an IP address counts as beyond this machine).
func listenRule(c config, host string) error {
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	switch {
	case c.authFile == "":
		return errors.New("without authentication (--auth-file) ledgerd only serves a loopback address (127.0.0.1, ::1, or localhost where it is one)")
	case c.tls.Cert == "" && !c.allowPlaintext:
		return errors.New("a non-loopback address needs TLS (--tls-cert, --tls-key), or --allow-plaintext behind a TLS-terminating proxy")
	}
	return nil
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

// redisModes are the values of --redis-mode.
var redisModes = []string{"single", "cluster", "sentinel"}

// parseRedisURL reads --redis-url in --redis-mode mode: how to make the
// client, where its TLS configuration is (nil without TLS) and the addresses
// it names. An error never holds the URL's password (redisURLError).
func parseRedisURL(mode, raw string) (newClient func() redis.UniversalClient, tlsConf **tls.Config, addrs []string, err error) {
	// Every mode: a caller's gRPC deadline bounds its Redis call too
	// (ContextTimeoutEnabled), and no client-name handshake (DisableIdentity);
	// internal/redisconf sets them, and the fault suite's clients share it.
	switch mode {
	case "single":
		var o *redis.Options
		if o, err = redis.ParseURL(raw); err == nil {
			redisconf.Single(o)
			tlsConf, addrs = &o.TLSConfig, []string{o.Addr}
			newClient = func() redis.UniversalClient { return redis.NewClient(o) }
		}
	case "cluster":
		var o *redis.ClusterOptions
		if o, err = redis.ParseClusterURL(raw); err == nil {
			// The slot map reloaded every second unless the URL says
			// otherwise: go-redis learns a failover from MOVED replies or
			// this reload.
			redisconf.Cluster(o)
			tlsConf, addrs = &o.TLSConfig, o.Addrs
			newClient = func() redis.UniversalClient { return redis.NewClusterClient(o) }
		}
	case "sentinel":
		var o *redis.FailoverOptions
		if o, err = redis.ParseFailoverURL(raw); err == nil {
			if o.MasterName == "" {
				err = errors.New("a sentinel URL needs ?master_name=NAME")
			}
			redisconf.Failover(o)
			tlsConf, addrs = &o.TLSConfig, o.SentinelAddrs
			newClient = func() redis.UniversalClient { return redis.NewFailoverClient(o) }
		}
	default:
		return nil, nil, nil, fmt.Errorf("--redis-mode %q: want single, cluster or sentinel", mode)
	}
	if err != nil {
		return nil, nil, nil, redisURLError(mode, raw, err)
	}
	return newClient, tlsConf, addrs, nil
}

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
	newClient, tlsConf, addrs, err := parseRedisURL(c.redisMode, c.redisURL)
	if err != nil {
		return nil, nil, usage(err)
	}
	if c.redisCA != "" {
		if *tlsConf == nil {
			return nil, nil, usage(errors.New("--redis-ca needs a rediss:// URL"))
		}
		pem, err := os.ReadFile(c.redisCA)
		if err != nil {
			return nil, nil, fmt.Errorf("--redis-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("--redis-ca %s: no PEM certificate in it", c.redisCA)
		}
		(*tlsConf).RootCAs = pool
	}
	rdb := newClient()
	log.Info("using Redis", "mode", c.redisMode, "addrs", addrs, "tls", *tlsConf != nil, "autopipeline", c.autopipeline)
	if c.autopipeline {
		// Concurrent calls' scripts share round trips: less CPU per call in
		// ledgerd and in Redis (docs/benchmarks.md). Each call is still one
		// command, and its deadline still bounds its wait.
		h := redisconf.Autopipeline(rdb)
		return rdb, func() { h.Close(); _ = rdb.Close() }, nil
	}
	return rdb, func() { _ = rdb.Close() }, nil
}

// durabilityChecks are the results of the start-up check, for the metric.
var durabilityChecks []ledger.DurabilityCheck

// checkDurability reads the Redis settings that decide whether records can
// be lost or evicted, warns about each unsafe one, and refuses to start with
// --require-durable. The embedded engine is not durable by design.
func checkDurability(ctx context.Context, c config, rdb redis.UniversalClient, log *slog.Logger) error {
	durabilityChecks = nil
	if c.redisURL == "" {
		if c.requireDurable {
			return errors.New("--require-durable: the embedded engine keeps nothing across a restart; set --redis-url")
		}
		return nil
	}
	l, err := ledger.New(rdb, ledger.Options{Prefix: c.prefix})
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	durabilityChecks = l.CheckDurability(cctx)
	var unsafe []string
	for _, d := range durabilityChecks {
		if !d.OK {
			unsafe = append(unsafe, d.Name)
			log.Warn("Redis durability: "+d.Name+" is unsafe", "setting", d.Name, "value", d.Value, "risk", d.Why)
		}
	}
	if len(unsafe) > 0 && c.requireDurable {
		return fmt.Errorf("--require-durable: Redis settings that can lose acknowledged records: %s (want appendonly yes, appendfsync always, maxmemory-policy noeviction)", strings.Join(unsafe, ", "))
	}
	return nil
}

// durabilityInterval is how often a running ledgerd reads the durability
// settings again.
var durabilityInterval = time.Minute

// watchDurability reads the durability settings every interval, so that
// ledger_store_durability_ok follows a setting changed on a running Redis
// (CONFIG SET), and logs each change. A setting it cannot read keeps its
// last result: an unreachable store is a store error, not an unsafe one.
func watchDurability(ctx context.Context, l *ledger.Ledger, met *metrics.Metrics, log *slog.Logger, checks []ledger.DurabilityCheck, every time.Duration) {
	ok := map[string]bool{}
	for _, d := range checks {
		ok[d.Name] = d.OK
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		now := l.CheckDurability(cctx)
		cancel()
		for _, d := range now {
			if d.Value == "" || d.OK == ok[d.Name] {
				continue
			}
			ok[d.Name] = d.OK
			met.SetDurability(d.Name, d.OK)
			if d.OK {
				log.Info("Redis durability: "+d.Name+" is safe again", "setting", d.Name, "value", d.Value)
			} else {
				log.Warn("Redis durability: "+d.Name+" is unsafe", "setting", d.Name, "value", d.Value, "risk", d.Why)
			}
		}
	}
}

// startTracing sets up OpenTelemetry tracing when --otlp-endpoint is set:
// an OTLP/gRPC exporter, W3C trace-context propagation (so an agent's trace
// links the ledger's spans), and the otelgrpc server handler.
func startTracing(ctx context.Context, c config) (func(), grpc.ServerOption, error) {
	if c.otlpEndpoint == "" {
		return func() {}, nil, nil
	}
	eopts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(c.otlpEndpoint)}
	if c.otlpInsecure {
		eopts = append(eopts, otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(ctx, eopts...)
	if err != nil {
		return nil, nil, fmt.Errorf("--otlp-endpoint: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "ledgerd"))))
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	otel.SetTextMapPropagator(prop)
	shutdown := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(sctx)
	}
	return shutdown, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop))), nil
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

// keygenOptions are the flags of "ledgerd keygen".
type keygenOptions struct {
	id, tenant, scopes string
}

// newKeygenFlagSet returns the flag set of "ledgerd keygen", which parses
// into o and writes its messages to stderr.
func newKeygenFlagSet(o *keygenOptions, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ledgerd keygen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.id, "id", "", "key id: letters, digits, '-' and '_' (required)")
	fs.StringVar(&o.tenant, "tenant", "", "tenant the key acts for (required)")
	fs.StringVar(&o.scopes, "scopes", "agent", "comma-separated scopes: agent, reconciler, viewer")
	return fs
}

// keygen prints a new API key and its credentials file entry.
func keygen(args []string, stdout, stderr io.Writer) error {
	var o keygenOptions
	fs := newKeygenFlagSet(&o, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // the usage is printed: -h succeeds, as ledgerd -h does
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("keygen: unexpected arguments %v: keygen takes flags only (--id, --tenant, --scopes)", fs.Args())
	}
	if o.id == "" || o.tenant == "" {
		return errors.New("keygen: --id and --tenant are required")
	}
	entry := fmt.Sprintf("keys:\n  - {id: %s, tenant: %q, scopes: [%s], secret_sha256: %s}\n", o.id, o.tenant, o.scopes, strings.Repeat("0", 64))
	if _, err := server.ParseCredentials([]byte(entry)); err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	key, hash, err := server.NewAPIKey(o.id)
	if err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	fmt.Fprintf(stdout, "# API key for the client (shown once, stored nowhere):\n#   %s\n", key)
	fmt.Fprintf(stdout, "# entry for the credentials file (the keys: list):\n  - {id: %s, tenant: %q, scopes: [%s], secret_sha256: %s}\n", o.id, o.tenant, o.scopes, hash)
	return nil
}

// redisLogger sends go-redis's own messages (reconnects, pool trouble) to the
// JSON log instead of plain lines on stderr.
type redisLogger struct{ log *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.log.WarnContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}

// redactURL returns raw with the password of its userinfo, and the value of
// every query parameter whose name holds "password" (a sentinel URL's
// master password), replaced by "xxxxx". It does not parse raw, so that a
// malformed URL is redacted too: the userinfo is everything between "://"
// (or the start, without a scheme) and the last '@'; its user name, before
// the first ':', stays (a userinfo without ':' is redacted whole). Over-redacting
// an '@' outside the userinfo is the price of never showing a password;
// when that '@' is inside a password parameter's value, the value's rest is
// cut too.
func redactURL(raw string) string {
	start := 0
	if i := strings.Index(raw, "://"); i > 0 && validScheme(raw[:i]) {
		start = i + len("://")
	}
	at := strings.LastIndexByte(raw, '@')
	if at < start {
		return raw[:start] + redactQuery(raw[start:])
	}
	user, _, ok := strings.Cut(raw[start:at], ":")
	if !ok {
		user = ""
	} else {
		user += ":"
	}
	rest := raw[at:]
	if inPasswordParam(raw[start:at]) {
		end := strings.IndexAny(rest, "&#")
		if end < 0 {
			end = len(rest)
		}
		rest = rest[end:]
	}
	if q := strings.IndexByte(raw[start:at], '?'); q >= 0 && strings.IndexByte(raw[start+q:at], '#') < 0 {
		// The last '@' is in the query: rest is the query's rest.
		return raw[:start] + user + "xxxxx" + redactParams(rest)
	}
	return raw[:start] + user + "xxxxx" + redactQuery(rest)
}

// redactQuery replaces the values of s's query parameters (after its first
// '?', up to a '#') whose names hold "password" by "xxxxx".
func redactQuery(s string) string {
	q := strings.IndexByte(s, '?')
	if q < 0 {
		return s
	}
	return s[:q+1] + redactParams(s[q+1:])
}

// redactParams replaces the values of the query parameters of s (up to a
// '#') whose names hold "password" by "xxxxx".
func redactParams(query string) string {
	frag := ""
	if h := strings.IndexByte(query, '#'); h >= 0 {
		query, frag = query[:h], query[h:]
	}
	params := strings.Split(query, "&")
	for i, p := range params {
		if k, _, _ := strings.Cut(p, "="); isPasswordParam(k) {
			params[i] = k + "=xxxxx"
		}
	}
	return strings.Join(params, "&") + frag
}

// inPasswordParam reports whether s ends inside the value of a query
// parameter whose name holds "password".
func inPasswordParam(s string) bool {
	q := strings.IndexByte(s, '?')
	if q < 0 || strings.IndexByte(s[q:], '#') >= 0 {
		return false
	}
	last := s[q+1:]
	if a := strings.LastIndexByte(last, '&'); a >= 0 {
		last = last[a+1:]
	}
	k, _, ok := strings.Cut(last, "=")
	return ok && isPasswordParam(k)
}

// isPasswordParam reports whether the query parameter name k (as written,
// or percent-decoded) holds "password", in any case.
func isPasswordParam(k string) bool {
	if d, err := url.QueryUnescape(k); err == nil {
		k = d
	}
	return strings.Contains(strings.ToLower(k), "password")
}

// validScheme reports whether s is a URL scheme (RFC 3986: a letter, then
// letters, digits, '+', '-' or '.').
func validScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// redisURLForms are the forms of --redis-url, by --redis-mode, as
// docs/configuration.md (section 3.2) writes them.
var redisURLForms = map[string]string{
	"single":   "redis://[user:password@]host:port[/db] (rediss:// for TLS, or unix:///path/to/redis.sock)",
	"cluster":  "redis://[user:password@]seed1:port?addr=seed2:port&addr=seed3:port (rediss:// for TLS)",
	"sentinel": "redis://[user:password@]sentinel1:26379?master_name=NAME&addr=sentinel2:26379 (rediss:// for TLS)",
}

// redisURLError is the error for a --redis-url that go-redis refused with
// err, without the URL's password: the URL is shown redacted (redactURL),
// and the form mode wants follows.
// go-redis's message is kept only when the URL is well formed and its last
// '@' ends its userinfo, so that no piece of the password can be elsewhere
// in it, and then with the password replaced. Otherwise (url.Parse failed,
// and its error quotes the input, or a piece of it such as an invalid
// escape or port) a message of its own replaces it.
func redisURLError(mode, raw string, err error) error {
	reason := "not a valid URL (reserved characters in the user name and password must be percent-encoded)"
	if u, perr := url.Parse(raw); perr == nil && u.Opaque == "" && !strings.ContainsRune(u.Host+u.Path+u.RawPath+u.RawQuery+u.Fragment, '@') {
		reason = err.Error()
		var secrets []string
		if u.User != nil {
			secrets = append(secrets, u.User.String())
			if p, ok := u.User.Password(); ok {
				secrets = append(secrets, p)
			}
			if start := strings.Index(raw, "://"); start >= 0 {
				if at := strings.LastIndexByte(raw, '@'); at > start {
					if _, p, ok := strings.Cut(raw[start+3:at], ":"); ok {
						secrets = append(secrets, p)
					}
				}
			}
		}
		// A password parameter's value, as written and decoded.
		for _, p := range strings.Split(u.RawQuery, "&") {
			if k, v, _ := strings.Cut(p, "="); isPasswordParam(k) {
				secrets = append(secrets, v)
				if d, err := url.QueryUnescape(v); err == nil {
					secrets = append(secrets, d)
				}
			}
		}
		for _, s := range secrets {
			if s != "" {
				reason = strings.ReplaceAll(reason, s, "xxxxx")
			}
		}
	}
	return fmt.Errorf("--redis-url %s (%s): %s; want %s", redactURL(raw), mode, reason, redisURLForms[mode])
}

// maxCompactBatch bounds --compact-batch: each second the pass asks Redis
// for that many keys in one SCAN and runs as many scripts, and Redis serves
// nothing else meanwhile.
const maxCompactBatch = 10000

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

	if err := checkDurability(ctx, c, rdb, log); err != nil {
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
		WaitReplicas: c.waitReplicas, WaitTimeout: c.waitTimeout})
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
	svc := server.New(server.Config{
		Ledger: l, Logger: log, Auth: auth, PublicReflection: c.publicReflection,
		Rate: c.rate, Burst: c.burst, Connections: c.conns,
	}, opts...)
	met.InitializeRPC(svc.GRPC)
	met.WatchStore(l, 0)
	met.WatchConnections(func() (int, uint64) { s := svc.Connections(); return s.Open, s.Refused })
	met.WatchHealthWatches(func() (int, uint64) { s := svc.HealthWatches(); return s.Open, s.Refused })
	for _, d := range durabilityChecks {
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
	if c.metricsListen != "" {
		mlis, err := net.Listen("tcp", c.metricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", met.Handler())
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
		checks, every := durabilityChecks, durabilityInterval
		g.Go(func() error { watchDurability(gctx, l, met, log, checks, every); return nil })
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
