package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
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
	// functions runs the scripts as Redis Functions (ledger.Options.NoFunctions).
	functions bool

	metricsListen  string
	httpListen     string
	receiptKeys    string
	receiptIssuer  string
	tenantLabel    bool
	otlpEndpoint   string
	otlpInsecure   bool
	requireDurable bool

	// conns bounds each client connection.
	conns server.ConnectionLimits
	// durabilityEvery is how often a running ledgerd reads the durability
	// settings again (no flag).
	durabilityEvery time.Duration
	// httpReadTimeout bounds the reading of one HTTP request, its body
	// included (no flag).
	httpReadTimeout time.Duration
	// httpIdleTimeout is how long the HTTP and metrics listeners keep a
	// connection with no request open (no flag).
	httpIdleTimeout time.Duration
}

// parseFlags reads the command line and the environment into a config. Its
// errors but flag.ErrHelp (-h) are usageErrors.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	c := config{durabilityEvery: time.Minute, httpReadTimeout: time.Minute, httpIdleTimeout: 2 * time.Minute}
	fs, finish := newFlagSet(&c, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, usage(err)
	}
	return c, usage(finish())
}

// usageHead heads ledgerd -h, above the flags.
const usageHead = `usage: ledgerd [flags]
       ledgerd keygen --id ID --tenant TENANT [--scopes agent,reconciler,viewer]
       ledgerd keygen --receipts [--id ID]

Serve ledger.v1.LedgerService on --listen (gRPC) and, with --http-listen,
the HTTP/JSON API and the operator console. With no --redis-url it runs the
embedded engine: nothing survives a restart. keygen prints a new API key and
its credentials file line, or with --receipts a receipt signing key
("ledgerd keygen -h"). Every flag also reads the environment variable named
in brackets. docs/configuration.md describes them.

flags:
`

// newFlagSet defines ledgerd's flags on a new flag set that fills c. Each
// flag's default is its environment variable when set, and its usage ends
// with that variable's name ("[LEDGER_LISTEN]"). finish checks the values,
// and converts those read as text into c, once the flag set has parsed the
// command line.
func newFlagSet(c *config, stderr io.Writer) (fs *flag.FlagSet, finish func() error) {
	fs = flag.NewFlagSet("ledgerd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		fs.PrintDefaults()
	}
	f := &envFlags{fs: fs}
	f.text(&c.listen, "listen", "LEDGER_LISTEN", "127.0.0.1:50051", "host:port to serve gRPC on: loopback, or with --auth-file and TLS (or --allow-plaintext) any address")
	f.text(&c.redisURL, "redis-url", "LEDGER_REDIS_URL", "", "Redis URL, e.g. redis://127.0.0.1:6379/0; empty runs the embedded engine (nothing survives a restart)")
	f.text(&c.policy, "policy", "LEDGER_POLICY", "", "policy file (YAML or JSON); empty uses the defaults")
	f.text(&c.prefix, "key-prefix", "LEDGER_KEY_PREFIX", ledger.DefaultPrefix, "first segment of every Redis key")
	f.text(&c.logLevel, "log-level", "LEDGER_LOG_LEVEL", "info", "debug, info, warn or error")
	f.parsed("sweep-interval", "LEDGER_SWEEP_INTERVAL", ledger.DefaultSweepInterval.String(), "how often expired leases are swept", duration(&c.sweepInterval, "want a positive duration like 1s"))
	f.parsed("compact-batch", "LEDGER_COMPACT_BATCH", strconv.Itoa(ledger.DefaultCompactBatch), "record keys per Redis master the compaction pass looks at each second, cutting terminal records past their retention to their tombstone; 0: off",
		count(&c.compactBatch, maxCompactBatch, fmt.Sprintf("want a count of keys up to %d, 0 for no compaction", maxCompactBatch)))
	f.parsed("shutdown-timeout", "LEDGER_SHUTDOWN_TIMEOUT", "10s", "how long running calls may take to finish at shutdown", durationOrZero(&c.shutdownTimeout, "want a duration like 10s"))
	f.text(&c.redisMode, "redis-mode", "LEDGER_REDIS_MODE", "single", "single, cluster (Redis Cluster: --redis-url lists seed nodes as ?addr=host:port) or sentinel (?master_name=NAME)")
	f.parsed("wait-replicas", "LEDGER_WAIT_REPLICAS", "0", "replicas every write and Lookup waits for (WAIT); 0: none", count(&c.waitReplicas, math.MaxInt, "want a count, 0 for none"))
	f.parsed("wait-timeout", "LEDGER_WAIT_TIMEOUT", "100ms", "how long a call waits for its replicas", duration(&c.waitTimeout, "want a positive duration like 100ms"))
	f.text(&c.redisCA, "redis-ca", "LEDGER_REDIS_CA", "", "CA of the Redis server's certificate, PEM, for a rediss:// URL with a private CA")
	f.text(&c.authFile, "auth-file", "LEDGER_AUTH_FILE", "", "credentials file (API keys, client certificates, tenant limits); empty: no authentication, loopback only")
	f.text(&c.tls.Cert, "tls-cert", "LEDGER_TLS_CERT", "", "server certificate chain, PEM")
	f.text(&c.tls.Key, "tls-key", "LEDGER_TLS_KEY", "", "server private key, PEM")
	f.text(&c.tls.ClientCA, "tls-client-ca", "LEDGER_TLS_CLIENT_CA", "", "CA of client certificates, PEM: enables mTLS")
	f.boolean(&c.publicReflection, "public-reflection", "LEDGER_PUBLIC_REFLECTION", false, "serve reflection to callers without credentials")
	f.parsed("rate-limit", "LEDGER_RATE_LIMIT", "0", "calls per second per tenant; 0: no limit", rate(&c.rate))
	f.parsed("rate-burst", "LEDGER_RATE_BURST", "0", "calls at once per tenant; 0: the rate, rounded up", count(&c.burst, math.MaxInt, "want a count, 0 for the rate"))
	f.parsed("max-unresolved", "LEDGER_MAX_UNRESOLVED", "100000", "unresolved operations a tenant may hold; 0: no limit", count(&c.maxUnresolved, math.MaxInt, "want a count, 0 for no limit"))
	f.boolean(&c.allowPlaintext, "allow-plaintext", "LEDGER_ALLOW_PLAINTEXT", false, "serve a non-loopback address without TLS, e.g. behind a TLS-terminating proxy")
	f.text(&c.httpListen, "http-listen", "LEDGER_HTTP_LISTEN", "", "host:port of the HTTP/JSON API (the same rules as --listen); empty: off")
	f.text(&c.receiptKeys, "receipt-keys", "LEDGER_RECEIPT_KEYS", "", "comma-separated JWK files of Ed25519 receipt keys: the first signs, the others only verify (rotation); empty: receipts off")
	f.text(&c.receiptIssuer, "receipt-issuer", "LEDGER_RECEIPT_ISSUER", "ledgerd", "the issuer id receipts name (iss)")
	f.text(&c.metricsListen, "metrics-listen", "LEDGER_METRICS_LISTEN", "", "address of the Prometheus /metrics listener, e.g. 127.0.0.1:9464; empty: off")
	f.boolean(&c.tenantLabel, "metrics-tenant-label", "LEDGER_METRICS_TENANT_LABEL", false, "add a tenant label to the ledger metrics")
	f.text(&c.otlpEndpoint, "otlp-endpoint", "LEDGER_OTLP_ENDPOINT", "", "OTLP/gRPC trace collector, host:port; empty: no tracing")
	f.boolean(&c.otlpInsecure, "otlp-insecure", "LEDGER_OTLP_INSECURE", false, "send traces without TLS")
	f.boolean(&c.requireDurable, "require-durable", "LEDGER_REQUIRE_DURABLE", false, "refuse to start unless Redis has appendonly yes, appendfsync always and maxmemory-policy noeviction")
	connectionFlags(f, &c.conns)
	f.boolean(&c.autopipeline, "redis-autopipeline", "LEDGER_REDIS_AUTOPIPELINE", true, "send the scripts of concurrent calls to Redis in shared pipelines (docs/benchmarks.md); false: one round trip each")
	f.boolean(&c.functions, "redis-functions", "LEDGER_REDIS_FUNCTIONS", true, "run the scripts as Redis Functions (FUNCTION LOAD once, FCALL per call) where the store has them; false: EVALSHA always")
	return fs, func() error {
		if err := f.finish(); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("unexpected arguments %v: ledgerd takes flags only (--name value, or --name=value), or keygen first", fs.Args())
		}
		return c.check()
	}
}

// connectionFlags defines the nine connection limits' flags, which fill l.
func connectionFlags(f *envFlags, l *server.ConnectionLimits) {
	const positive = "want a positive duration like 10s or 5m"
	f.parsed("handshake-timeout", "LEDGER_HANDSHAKE_TIMEOUT", "10s", "how long a new connection may take to finish its TLS and HTTP/2 handshakes", duration(&l.HandshakeTimeout, positive))
	f.parsed("max-connection-idle", "LEDGER_MAX_CONNECTION_IDLE", "5m", "close (GOAWAY) a connection without calls for that long; clients reconnect on their next call", duration(&l.MaxConnectionIdle, positive))
	f.parsed("keepalive-time", "LEDGER_KEEPALIVE_TIME", "1m", "ping a client after that long without a frame from it; at least 1s", atLeast(&l.KeepaliveTime, time.Second, positive))
	f.parsed("keepalive-timeout", "LEDGER_KEEPALIVE_TIMEOUT", "20s", "close the connection when that ping is not answered within that long", duration(&l.KeepaliveTimeout, positive))
	f.parsed("max-concurrent-streams", "LEDGER_MAX_CONCURRENT_STREAMS", strconv.Itoa(server.DefaultMaxConcurrentStreams), "calls one connection may run at once; the client holds further ones until one ends", streams(&l.MaxConcurrentStreams))
	f.parsed("max-connection-age", "LEDGER_MAX_CONNECTION_AGE", "30m", "send GOAWAY to a connection that has lived that long (give or take 10%), so that clients spread over new instances; 0: never", orNever(&l.MaxConnectionAge))
	f.parsed("max-connection-age-grace", "LEDGER_MAX_CONNECTION_AGE_GRACE", "1m", "how long the calls running at that GOAWAY may take to finish before the connection is closed", duration(&l.MaxConnectionAgeGrace, positive))
	f.parsed("max-connections", "LEDGER_MAX_CONNECTIONS", strconv.Itoa(server.DefaultMaxConnections), "client connections open at once (gRPC and HTTP listeners together); one more is closed as soon as it is accepted (its client sees UNAVAILABLE); 0: no limit", limit(&l.MaxConnections))
	f.parsed("max-health-watches", "LEDGER_MAX_HEALTH_WATCHES", strconv.Itoa(server.DefaultMaxHealthWatches), "grpc.health.v1.Health/Watch streams open at once, over all connections; one more is answered RESOURCE_EXHAUSTED at once (Check is not bounded); 0: no limit", limit(&l.MaxHealthWatches))
}

// check refuses combinations of flags, and values no single flag's parser
// can judge.
func (c *config) check() error {
	if !slices.Contains(redisModes, c.redisMode) {
		return fmt.Errorf("--redis-mode %q: want single, cluster or sentinel", c.redisMode)
	}
	// The embedded engine would ignore these, or fail every call on them:
	// a setting meant for Redis without --redis-url is a mistake.
	if c.redisURL == "" && c.waitReplicas > 0 {
		return fmt.Errorf("--wait-replicas %d: the embedded engine has no replicas (set --redis-url)", c.waitReplicas)
	}
	if c.redisURL == "" && c.redisCA != "" {
		return errors.New("--redis-ca needs a rediss:// URL (--redis-url); the embedded engine speaks no TLS")
	}
	if c.redisURL == "" && c.redisMode != "single" {
		return fmt.Errorf("--redis-mode %s needs a Redis URL (set --redis-url); the embedded engine is a single node", c.redisMode)
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
	if c.metricsListen != "" {
		if _, _, err := net.SplitHostPort(c.metricsListen); err != nil {
			return fmt.Errorf("--metrics-listen %q: want HOST:PORT, e.g. 127.0.0.1:9464 (%v)", c.metricsListen, err)
		}
	}
	if c.otlpEndpoint != "" {
		// The exporter would take anything, and send every span nowhere
		// (a HOST alone to port 443).
		if h, _, err := net.SplitHostPort(c.otlpEndpoint); err != nil || h == "" {
			return fmt.Errorf("--otlp-endpoint %q: want HOST:PORT of the OTLP/gRPC collector, e.g. 127.0.0.1:4317 (no scheme)", c.otlpEndpoint)
		}
	}
	return nil
}

// checkListen refuses to serve beyond this machine without authentication
// (any caller could read and write every operation), and without TLS (API
// keys would cross the network in clear) unless told otherwise. It judges
// the address as given, before anything starts; the name localhost passes
// here, and checkBoundAs judges where it went.
func checkListen(c config) error {
	if err := checkListenAs(c, "--listen", c.listen, "127.0.0.1:50051"); err != nil {
		return err
	}
	if c.httpListen != "" {
		return checkListenAs(c, "--http-listen", c.httpListen, "127.0.0.1:8080")
	}
	return nil
}

// checkListenAs is checkListen for the address addr of flag.
func checkListenAs(c config, flag, addr, example string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT, e.g. %s (%w)", flag, addr, example, err)
	}
	if host == "localhost" {
		return nil
	}
	if err := listenRule(c, host); err != nil {
		return fmt.Errorf("%s %q: %w", flag, addr, err)
	}
	return nil
}

// checkBoundAs applies checkListen's rules to the address the listener of
// flag bound, asked for addr: a name is where the hosts file or the
// resolver says it is, and localhost need not be loopback there.
func checkBoundAs(c config, flag, addr string, bound net.Addr) error {
	host, _, err := net.SplitHostPort(bound.String())
	if err != nil {
		host = bound.String()
	}
	if err := listenRule(c, host); err != nil {
		return fmt.Errorf("%s %q bound %s, which is not loopback: %w", flag, addr, bound, err)
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
