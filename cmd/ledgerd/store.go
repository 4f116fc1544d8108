package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/opledger/ledger/internal/redisconf"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/metrics"
	"github.com/redis/go-redis/v9"
)

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

// checkDurability reads the Redis settings that decide whether records can
// be lost or evicted, warns about each unsafe one, and refuses to start with
// --require-durable. It returns the checks, for the metric. The embedded
// engine is not durable by design.
func checkDurability(ctx context.Context, c config, rdb redis.UniversalClient, log *slog.Logger) ([]ledger.DurabilityCheck, error) {
	if c.redisURL == "" {
		if c.requireDurable {
			return nil, errors.New("--require-durable: the embedded engine keeps nothing across a restart; set --redis-url")
		}
		return nil, nil
	}
	l, err := ledger.New(rdb, ledger.Options{Prefix: c.prefix})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	checks := l.CheckDurability(cctx)
	var unsafe []string
	for _, d := range checks {
		if !d.OK {
			unsafe = append(unsafe, d.Name)
			log.Warn("Redis durability: "+d.Name+" is unsafe", "setting", d.Name, "value", d.Value, "risk", d.Why)
		}
	}
	if len(unsafe) > 0 && c.requireDurable {
		return checks, fmt.Errorf("--require-durable: Redis settings that can lose acknowledged records: %s (want appendonly yes, appendfsync always, maxmemory-policy noeviction)", strings.Join(unsafe, ", "))
	}
	return checks, nil
}

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

// redisLogger sends go-redis's own messages (reconnects, pool trouble) to the
// JSON log instead of plain lines on stderr.
type redisLogger struct{ log *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.log.WarnContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}
