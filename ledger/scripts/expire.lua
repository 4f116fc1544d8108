-- expire.lua: the sweeper's lease expiry for one operation (contract.md §4: expired
-- leases are also swept in the background).
--
-- KEYS[1..5] -> record, unresolved index, lease index, stats, overdue
--               (see common.lua)
-- ARGV[1] -> principal ("ledger")
-- ARGV[2] -> lease index member
--
-- Output: {code, aux, record, moved} (common.lua, reply) or {code, aux, ''}:
--   {C_OK, 'unknown', record}   an irreversible operation's lease had expired:
--                               it is UNKNOWN now (LEASE_EXPIRED)
--   {C_OK, 'dropped', ''}       nothing to expire (gone, not RUNNING, or an
--                               idempotent operation, which stays RUNNING
--                               past its lease until reclaimed, and is
--                               listed as overdue from lease end + recovery
--                               window): the lease index entry is removed
--   {C_OK, 'live', ''}          the lease was renewed; nothing changes
--
-- Idempotent: a second run finds UNKNOWN and only drops the index entry.

if not load() or R.st ~= ST_RUNNING then
  redis.call('ZREM', KEYS[3], S.member)
  return {C_OK, 'dropped', ''}
end
if tonumber(R.lse) > NOW then
  return {C_OK, 'live', ''}
end
if R.eff ~= EFF_IRREVERSIBLE then
  redis.call('ZREM', KEYS[3], S.member)
  redis.call('ZADD', KEYS[5], tostr(tonumber(R.lse) + ms(R.rwin)), overdue_member(ST_RUNNING))
  return {C_OK, 'dropped', ''}
end
transition(ST_UNKNOWN, 'LEASE_EXPIRED', '')
return reply(C_OK, 'unknown')
