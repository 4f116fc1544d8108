package ledger

import "strings"

// ACLCommands are the only commands the ledger sends to Redis: directly
// (scripts, the sweeper's and ListUnresolved's reads, the connection
// handshake) and from inside its scripts, which Redis checks against the
// same ACL.
var ACLCommands = []string{
	// connection and scripts; wait (and set, of the shard's WAIT marker,
	// before it) only with Options.WaitReplicas
	"hello", "ping", "eval", "evalsha", "script|load", "wait",
	// reads outside scripts (ListUnresolved, Sweep, the live counts, the
	// compaction pass's walk over the record keys) and the clock
	"time", "get", "hgetall", "zrangebylex", "zrangebyscore", "zrem", "scan",
	// inside the scripts; pttl only in the compaction's; lrange and del
	// only for records of the previous layout, which the scripts convert
	// (scripts/common.lua, load_legacy)
	"set", "pttl", "hdel", "hincrby", "zadd", "zcard", "lrange", "del",
}

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
	if prefix == "" {
		prefix = DefaultPrefix
	}
	var b strings.Builder
	b.WriteString("~" + prefix + ":* resetchannels -@all")
	for _, c := range ACLCommands {
		b.WriteString(" +" + c)
	}
	return b.String()
}
