package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/server"
)

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

// maxCompactBatch bounds --compact-batch: each second the pass asks Redis
// for that many keys in one SCAN and runs as many scripts, and Redis serves
// nothing else meanwhile.
const maxCompactBatch = 10000
