// Package redisconf sets up go-redis clients the way ledgerd runs them, so
// that ledgerd (cmd/ledgerd) and the tests that must run the ledger as it
// does (internal/faults) share one set-up.
package redisconf

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/internal/autopipe"
)

// ClusterStateReloadInterval is how often a cluster client reloads its slot
// map unless told otherwise. go-redis learns a failover from MOVED replies
// or this reload (a refused connection does not reload it); its 60s default
// leaves a dead master's slots unreachable that long.
const ClusterStateReloadInterval = time.Second

// Single sets a --redis-mode single client's options: a caller's deadline
// bounds its Redis call too (ContextTimeoutEnabled), and no client-name
// handshake (DisableIdentity).
func Single(o *redis.Options) {
	o.DisableIdentity, o.ContextTimeoutEnabled = true, true
}

// Cluster sets a --redis-mode cluster client's options: as Single's, and
// the slot map reloaded every ClusterStateReloadInterval unless o sets
// another interval.
func Cluster(o *redis.ClusterOptions) {
	o.DisableIdentity, o.ContextTimeoutEnabled = true, true
	if o.ClusterStateReloadInterval == 0 {
		o.ClusterStateReloadInterval = ClusterStateReloadInterval
	}
}

// Failover sets a --redis-mode sentinel client's options: as Single's.
func Failover(o *redis.FailoverOptions) {
	o.DisableIdentity, o.ContextTimeoutEnabled = true, true
}

// Autopipeline enables on rdb the batching of concurrent scripts that
// ledgerd enables unless --redis-autopipeline=false, with the same options,
// and returns the hook: close it before rdb.
func Autopipeline(rdb redis.UniversalClient) *autopipe.Hook {
	return autopipe.Enable(rdb, autopipe.Options{})
}
