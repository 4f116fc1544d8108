-- renew.lua: extend the lease of a running claim (contract.md §4, Renew).
--
-- KEYS[1..5] -> record, unresolved index, lease index, stats, overdue
--               (see common.lua)
-- ARGV[1] -> principal
-- ARGV[2] -> lease index member
-- ARGV[3] -> fencing token of the claim
--
-- Output: {code, aux, record, moved} (common.lua, reply) or {code, aux, ''}:
--   {C_OK, '', record, ''}   the lease now ends at the record's lse
--   {C_STALE, state, ''}     the claim is gone: another token is current, the
--                            operation left RUNNING, or the lease already
--                            expired
--   {C_STALE, state, record, moved}  the lease expired, and the irreversible
--                            operation becomes UNKNOWN here, as the sweeper
--                            would make it: the record comes with the
--                            transition, which the caller reports
--   {C_NOT_FOUND, '', ''} / {C_EXPIRED, state, ''}
--
-- A repeat extends the lease from the store's current time again: the same
-- outcome as one call.

local token = ARGV[3]

if not load() then
  return missing()
end
if R.tok ~= token or R.st ~= ST_RUNNING then
  return {C_STALE, R.st, ''}
end
if tonumber(R.lse) <= NOW then
  if R.eff == EFF_IRREVERSIBLE then
    transition(ST_UNKNOWN, 'LEASE_EXPIRED', '')
    return reply(C_STALE, R.st)
  end
  return {C_STALE, R.st, ''}
end
local lease_end = tostr(NOW + ms(R.lms))
set('lse', lease_end)
flush()
redis.call('ZADD', KEYS[3], lease_end, S.member)
return reply(C_OK, '')
