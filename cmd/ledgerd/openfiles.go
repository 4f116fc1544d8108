package main

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// openFilesMargin is how many open files ledgerd counts for itself besides
// client connections and Redis pools: its listeners (gRPC and metrics), the
// metrics scrapes, the OTLP exporter's connection, the Go runtime's own
// descriptors (epoll, its wake-up pipe), standard input, output and error,
// the files read at start-up and on SIGHUP, the connections to sentinels
// and a cluster's replicas. It is generous: they take a few dozen.
const openFilesMargin = 100

// redisConnections is how many connections ledgerd may hold to its store:
// pool_size + pipeline_pool_size for each Redis server its commands go to
// (each master in cluster mode, the master in sentinel mode), twice that for
// the embedded engine, whose server ends are in this process too. rdb is
// the client openStore made, the scripts already loaded (so a cluster
// client knows its masters).
func redisConnections(ctx context.Context, c config, rdb redis.UniversalClient) int {
	perServer := func(pool, pipeline int) int {
		switch {
		case pipeline == 0:
			pipeline = redis.DefaultPipelinePoolSize
		case pipeline < 0: // no pipeline pool
			pipeline = 0
		}
		return pool + pipeline
	}
	switch r := rdb.(type) {
	case *redis.ClusterClient:
		o := r.Options()
		var masters atomic.Int64
		_ = r.ForEachMaster(ctx, func(context.Context, *redis.Client) error {
			masters.Add(1)
			return nil
		})
		return max(int(masters.Load()), len(o.Addrs)) * perServer(o.PoolSize, o.PipelinePoolSize)
	case *redis.Client:
		o := r.Options()
		n := perServer(o.PoolSize, o.PipelinePoolSize)
		if c.redisURL == "" {
			n *= 2
		}
		return n
	}
	return 0
}

// checkOpenFiles warns, once at start-up, when the open-file limit (limit,
// RLIMIT_NOFILE as Go raised it) cannot hold maxConns client connections
// besides redisConns connections to Redis and openFilesMargin of ledgerd's
// own: accept would then fail (EMFILE) below --max-connections, and a
// client over that would wait in the accept queue until its deadline
// instead of being refused at once. maxConns below 1 is no limit: nothing
// to compare. It does not refuse to start: the open-file limit and
// --max-connections are both the operator's, the limit may be raised on
// the running process (prlimit), and --max-connections is a ceiling a
// deployment may never reach.
func checkOpenFiles(log *slog.Logger, maxConns, redisConns int, limit uint64) {
	if maxConns < 1 {
		return
	}
	need := uint64(maxConns) + uint64(redisConns) + openFilesMargin
	if limit >= need {
		return
	}
	fits := int64(limit) - int64(redisConns) - openFilesMargin
	if fits < 0 {
		fits = 0
	}
	log.Warn("open-file limit too low for --max-connections: past the connections it allows, accept fails (too many open files) and new clients wait until their deadline instead of being refused; raise ulimit -n (LimitNOFILE= under systemd) to at least needed_open_files, or lower --max-connections to fits_max_connections",
		"open_file_limit", limit, "max_connections", maxConns, "redis_connections", redisConns,
		"needed_open_files", need, "fits_max_connections", fits)
}
