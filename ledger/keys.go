package ledger

import (
	"errors"
	"strings"
)

// NumShards is how many hash slots the ledger spreads operations over. An
// operation's shard is a hash of its tenant and id; every key of one
// operation, and the indexes a transition maintains with it, carry the
// shard's hash tag, so each script touches one slot only and runs unchanged
// on Redis Cluster. The number is part of the key layout: changing it moves
// every operation to another key, so it only changes with a new prefix.
const NumShards = 64

// DefaultPrefix is the default first segment of every key.
const DefaultPrefix = "ledger"

// keyspace builds every Redis key the ledger uses, one function per key, so
// the layout lives in one place (docs/design.md describes it).
//
//	<prefix>:{sNN}:op:<tenant>:<id>       operation record with its history, and
//	                                      its tombstone after its retention (string)
//	<prefix>:{sNN}:unresolved:<tenant>    non-terminal operations of a tenant in
//	                                      this shard (zset, ordered by member)
//	<prefix>:{sNN}:leases                 running claims of this shard by lease
//	                                      end (zset, all tenants, for the sweeper)
//	<prefix>:{sNN}:stats                  live counts of the shard's non-terminal
//	                                      operations by tool, state and tenant (hash)
//	<prefix>:{sNN}:overdue                the shard's operations by when they are
//	                                      overdue (zset, for the metrics)
//	<prefix>:{sNN}:wait                   written before every WAIT of a call on the
//	                                      shard, with Options.WaitReplicas (string)
//	<prefix>:{sNN}:run:<tenant>:<run>     a run, its counts and admitted operations
//	                                      (hash; the shard of the tenant and run id)
//	<prefix>:{sNN}:runs:<tenant>          the tenant's runs in this shard (zset,
//	                                      running first; see scripts/runs.lua)
//
// Tenants and ids are percent-encoded (see encodeComponent), so no byte of
// theirs can open a hash tag, add a separator, or reach another tenant's key.
type keyspace struct {
	prefix string
	shards *[NumShards]shardKeys
}

// shardKeys are the keys of one shard, built once by newKeyspace.
type shardKeys struct {
	tag, leases, stats, overdue, wait string
}

// newKeyspace returns the keyspace under prefix.
func newKeyspace(prefix string) keyspace {
	k := keyspace{prefix: prefix, shards: new([NumShards]shardKeys)}
	for s := range k.shards {
		tag := prefix + ":{s" + string([]byte{'0' + byte(s/10), '0' + byte(s%10)}) + "}"
		k.shards[s] = shardKeys{tag: tag, leases: tag + ":leases", stats: tag + ":stats", overdue: tag + ":overdue", wait: tag + ":wait"}
	}
	return k
}

// opKeys are the keys of one operation, in the order every write script
// takes them (KEYS[1..5] in common.lua).
type opKeys struct {
	tenant, id string // raw
	shard      int
	all        []string // record, unresolved, leases, stats, overdue
	member     string   // the operation's member in the lease index
}

func (k keyspace) tag(shard int) string {
	return k.shards[shard].tag
}

// shardOf returns the shard of an operation: FNV-1a of the encoded tenant,
// a colon and the encoded id, modulo NumShards.
func shardOf(tenant, id string) int {
	return shardOfEncoded(encodeComponent(tenant), encodeComponent(id))
}

// shardOfEncoded is shardOf of the encoded tenant t and id i.
func shardOfEncoded(t, i string) int {
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for j := 0; j < len(t); j++ {
		h = (h ^ uint32(t[j])) * prime
	}
	h = (h ^ ':') * prime
	for j := 0; j < len(i); j++ {
		h = (h ^ uint32(i[j])) * prime
	}
	return int(h % NumShards)
}

// record is the key of an operation's record.
func (k keyspace) record(shard int, t, id string) string {
	return k.tag(shard) + ":op:" + t + ":" + id
}

// unresolved is the key of a tenant's unresolved index in one shard.
func (k keyspace) unresolved(shard int, t string) string {
	return k.tag(shard) + ":unresolved:" + t
}

// leases is the key of a shard's lease index.
func (k keyspace) leases(shard int) string {
	return k.shards[shard].leases
}

// stats is the key of a shard's live counts.
func (k keyspace) stats(shard int) string {
	return k.shards[shard].stats
}

// overdue is the key of a shard's operations by when they are overdue.
func (k keyspace) overdue(shard int) string {
	return k.shards[shard].overdue
}

// wait is the key of a shard's WAIT marker (Ledger.evalWait).
func (k keyspace) wait(shard int) string {
	return k.shards[shard].wait
}

// op returns the keys of one operation. Its lease index member is the
// record key's tail, so the two share one string.
func (k keyspace) op(tenant, id string) opKeys {
	t, i := encodeComponent(tenant), encodeComponent(id)
	s := shardOfEncoded(t, i)
	rec := k.record(s, t, i)
	return opKeys{
		tenant: tenant,
		id:     id,
		shard:  s,
		all: []string{
			rec,
			k.unresolved(s, t),
			k.leases(s),
			k.stats(s),
			k.overdue(s),
		},
		member: rec[len(k.tag(s))+len(":op:"):],
	}
}

// runKeys are the keys of one run, in the order the run scripts take them.
type runKeys struct {
	shard  int
	all    []string // record, index
	member string   // the run's member in the index: its encoded id
}

// run returns the keys of one run.
func (k keyspace) run(tenant, id string) runKeys {
	t, i := encodeComponent(tenant), encodeComponent(id)
	s := shardOfEncoded(t, i)
	return runKeys{shard: s, all: []string{k.runRecord(s, t, i), k.runIndex(s, t)}, member: i}
}

// runRecord is the key of a run's record.
func (k keyspace) runRecord(shard int, t, id string) string {
	return k.tag(shard) + ":run:" + t + ":" + id
}

// runIndex is the key of a tenant's runs in one shard.
func (k keyspace) runIndex(shard int, t string) string {
	return k.tag(shard) + ":runs:" + t
}

// opFromLeaseMember returns the keys of the operation a lease index member
// names.
func (k keyspace) opFromLeaseMember(member string) (opKeys, error) {
	t, i, ok := strings.Cut(member, ":")
	if !ok {
		return opKeys{}, errors.New("lease member without separator")
	}
	tenant, err := decodeComponent(t)
	if err != nil {
		return opKeys{}, err
	}
	id, err := decodeComponent(i)
	if err != nil {
		return opKeys{}, err
	}
	return k.op(tenant, id), nil
}

// encodeComponent percent-encodes every byte outside [A-Za-z0-9._~-], so the
// result never holds ':', '{', '}', '%' as data, and distinct inputs give
// distinct outputs.
func encodeComponent(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if !unreserved(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	const hexdigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexdigits[c>>4])
		b.WriteByte(hexdigits[c&15])
	}
	return b.String()
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '~' || c == '-'
}

// decodeComponent reverses encodeComponent; it refuses anything
// encodeComponent cannot have produced.
func decodeComponent(s string) (string, error) {
	if !strings.Contains(s, "%") {
		for i := 0; i < len(s); i++ {
			if !unreserved(s[i]) {
				return "", errors.New("invalid byte in encoded component")
			}
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case unreserved(c):
			b = append(b, c)
		case c == '%' && i+2 < len(s):
			hi, lo := unhex(s[i+1]), unhex(s[i+2])
			if hi < 0 || lo < 0 || unreserved(byte(hi<<4|lo)) {
				return "", errors.New("invalid escape in encoded component")
			}
			b = append(b, byte(hi<<4|lo))
			i += 2
		default:
			return "", errors.New("invalid byte in encoded component")
		}
	}
	return string(b), nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
