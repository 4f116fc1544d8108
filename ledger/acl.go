package ledger

import "strings"

// ACLCommands are the only commands the ledger sends to Redis: directly
// (scripts, the sweeper's and ListUnresolved's reads, the connection
// handshake) and from inside its scripts, which Redis checks against the
// same ACL.
var ACLCommands = []string{
	// connection and scripts (the library's functions, or where the store
	// has none the scripts themselves); wait (and set, of the shard's WAIT marker,
	// before it) only with Options.WaitReplicas
	"hello", "ping", "fcall", "function|load", "eval", "evalsha", "script|load", "wait",
	// reads outside scripts (ListUnresolved, Sweep, the live counts, the
	// compaction pass's walk over the record keys, the unresolved limit's
	// counts) and the clock
	"time", "get", "hgetall", "zrangebylex", "zrangebyscore", "zrem", "scan", "zcard",
	// inside the scripts; pttl only in the compaction's; the hash
	// commands, exists, persist and pexpireat only in the run scripts'
	// (exists also outside them: whether a run exists)
	"set", "pttl", "hdel", "hincrby", "zadd",
	"exists", "hget", "hmget", "hset", "persist", "pexpireat",
}

// ACLClusterCommands are the commands a Redis Cluster user needs besides
// ACLCommands: go-redis's cluster client sends them on its own, to every
// node, to find where the ledger's keys are and how to route its commands.
var ACLClusterCommands = []string{
	// the slot map: without it no call reaches any master
	"cluster|slots",
	// the command table, read once to route commands; refused, every call
	// that routes by it asks again (a refused round trip to up to three
	// nodes, and a log line of go-redis's, each time)
	"command",
}

// ACLSentinelCommands are the only commands go-redis's failover client
// (--redis-mode sentinel) sends to a sentinel, and ACLSentinelChannels the
// only channels it subscribes to there. The master is run as the user of
// ACLRules: the client sends it nothing else.
var ACLSentinelCommands = []string{
	// where the master is
	"sentinel|get-master-addr-by-name",
	// the other sentinels, to ask them when this one is gone
	"sentinel|sentinels",
	// told of a failover at once (ACLSentinelChannels); the subscription
	// is pinged after 3 s without a message, and reconnected if refused
	"subscribe", "ping",
}

// ACLSentinelChannels are the channels of ACLSentinelCommands' subscribe.
var ACLSentinelChannels = []string{"+switch-master", "+replica-reconf-done"}

// ACLRules returns the rules of the least-privileged Redis user the ledger
// can run as: only its keys (prefix:*), no channels, only ACLCommands.
// (SCAN, for the compaction pass, is not filtered by key patterns: it lists
// the names of every key in the database.) Use it as
//
//	ACL SETUSER ledger on >PASSWORD <rules>
//
// and put the user and password in the Redis URL
// (redis://ledger:PASSWORD@host:6379/0).
func ACLRules(prefix string) string {
	return aclRules(prefix, ACLCommands)
}

// ClusterACLRules returns the rules of the least-privileged Redis user the
// ledger can run as on a Redis Cluster (--redis-mode cluster): ACLRules
// and ACLClusterCommands. Create the user on every node, masters and
// replicas (a replica promoted by a failover serves the same user).
func ClusterACLRules(prefix string) string {
	return aclRules(prefix, ACLCommands, ACLClusterCommands)
}

// SentinelACLRules returns the rules of the least-privileged user the
// ledger can connect to sentinels as, when they have ACLs of their own: no
// keys, ACLSentinelChannels, ACLSentinelCommands. Create it on every
// sentinel and put it in the Redis URL (redis://USER:PASSWORD@sentinel...);
// the master's user (ACLRules) goes in its username and password
// parameters.
func SentinelACLRules() string {
	var b strings.Builder
	b.WriteString("resetchannels")
	for _, c := range ACLSentinelChannels {
		b.WriteString(" &" + c)
	}
	b.WriteString(" -@all")
	for _, c := range ACLSentinelCommands {
		b.WriteString(" +" + c)
	}
	return b.String()
}

func aclRules(prefix string, commands ...[]string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	var b strings.Builder
	b.WriteString("~" + prefix + ":* resetchannels -@all")
	for _, cs := range commands {
		for _, c := range cs {
			b.WriteString(" +" + c)
		}
	}
	return b.String()
}
