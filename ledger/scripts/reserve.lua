-- reserve.lua: record the intent of an operation and decide how the caller
-- proceeds (contract.md §4, the Reserve table).
--
-- KEYS[1..5] -> record, unresolved index, lease index, stats, overdue
--               (see common.lua)
-- ARGV[1]  -> principal
-- ARGV[2]  -> lease index member
-- ARGV[3]  -> tool
-- ARGV[4]  -> fingerprint (32 bytes)
-- ARGV[5]  -> permit id
-- ARGV[6]  -> holder
-- ARGV[7]  -> lease (ms)
-- ARGV[8]  -> operation id (raw), for the unresolved index member
-- ARGV[9]  -> digest of the policy's consequential fields ('' for all fields)
-- ARGV[10] -> the consequential fields, a JSON list ('' for all fields)
-- ARGV[11] -> '' when the call may create the operation, '0' when the
--             tenant's unresolved limit leaves no room (Ledger.reserveWithin)
-- ARGV[12] -> the operation this one compensates (raw id, '' for none)
-- ARGV[13] -> the new record's stored form after its creation time
--             (record.go, newRecord.tail): everything a new operation
--             records but the time, encoded by ledgerd
--
-- Output: {code, aux, record, moved}, record in its stored form (common.lua,
-- reply), or {code, aux, ''}:
--   {C_EXECUTE, '', record}       the caller holds the claim (new, claimed,
--                                 reclaimed, or its own live claim again)
--   {C_REPLAY, '', record}        terminal: replay the recorded outcome
--   {C_IN_PROGRESS, ms, record}   another holder's live claim ends in ms
--   {C_RECONCILE, '', record}     UNKNOWN (now or just now): reconcile first
--   {C_KEY_REUSED, mask, ''}      tool (1), fingerprint (2), permit (4),
--                                 compensated operation (8) differ;
--                                 of an expired record only the fingerprint
--                                 is compared (its tombstone keeps no more)
--   {C_EXPIRED, state, ''}        the record expired, and the fingerprint
--                                 is its own (a late replay); its final state
--   {C_QUOTA, '', ''}             a new operation, and no room under the
--                                 tenant's unresolved limit
--   {C_FIELDS, fields, ''}        the record was fingerprinted over other
--                                 consequential fields (the policy changed):
--                                 call again with a fingerprint over these
--
-- Run twice with the same arguments, it gives the same decision: the second
-- run finds the caller's own live claim (same holder) and returns EXECUTE
-- with the same attempt and token, without a second history entry.

local tool, fp, permit, holder = ARGV[3], ARGV[4], ARGV[5], ARGV[6]

local function claim(reason)
  local tok = tonumber(R.tok or '0') + 1
  if tok < NOW then
    tok = NOW
  end
  local lease_end = tostr(NOW + ms(R.lms))
  if lapsed() and R.eff ~= EFF_IRREVERSIBLE then
    redis.call('ZREM', KEYS[5], overdue_member(ST_RUNNING))
  end
  set('att', tostr(tonumber(R.att or '0') + 1))
  set('tok', tostr(tok))
  set('hld', holder)
  set('lse', lease_end)
  set_outcome('', '', '', '')
  transition(ST_RUNNING, reason, '')
  redis.call('ZADD', KEYS[3], lease_end, S.member)
  return reply(C_EXECUTE, '')
end

if not load() then
  if S.expired then
    -- The tombstone keeps the fingerprint (contract.md §6): other parameters under
    -- the key are no late replay but a reuse of the key, and EXPIRED with
    -- the final state would tell that new intent it ended so. The fields
    -- bound at creation decide: the whole record's cfh and cf, a compacted
    -- tombstone's cf (S.tcf); a tombstone compacted before it kept them has
    -- lost them, and the current policy's count. Tool and permit are not in
    -- a tombstone: with the same parameters it answers EXPIRED.
    if R.fp ~= fp then
      if R.att and R.att ~= '' and (R.cfh or '') ~= ARGV[9] then
        return {C_FIELDS, R.cf or '', ''}
      end
      if S.tcf and S.tcf ~= ARGV[10] then
        return {C_FIELDS, S.tcf, ''}
      end
      return {C_KEY_REUSED, '2', ''}
    end
    return missing()
  end
  if ARGV[11] ~= '' then
    return {C_QUOTA, '', ''}
  end
  -- A new record, RUNNING under its first claim: every field but the
  -- creation time arrives encoded, and the times it would hold (updated,
  -- token, the history entry's) are that time, so stored as empty. It
  -- moved from no state ('0') after no time in it.
  local c36 = F.base36(NOW)
  local rec = 'L' .. fp .. ST_RUNNING .. '\255\255' .. c36 .. ARGV[13]
  redis.call('SET', KEYS[1], rec)
  R.tool = tool
  F.bump(ST_RUNNING, '1')
  redis.call('ZADD', KEYS[3], tostr(NOW + ARGV[7]), S.member)
  redis.call('ZADD', KEYS[2], '0', F.umember(c36, ARGV[8]))
  return {C_EXECUTE, '', rec, '0:0'}
end

-- The fields the fingerprint covers are bound at creation: a changed policy
-- must not turn the retries of a running operation into conflicts.
if (R.cfh or '') ~= ARGV[9] then
  return {C_FIELDS, R.cf or '', ''}
end

local mask = 0
if R.tool ~= tool then mask = mask + 1 end
if R.fp ~= fp then mask = mask + 2 end
if R.pmt ~= permit then mask = mask + 4 end
if (R.cmp or '') ~= ARGV[12] then mask = mask + 8 end
if mask ~= 0 then
  return {C_KEY_REUSED, tostr(mask), ''}
end

local st = R.st
local exhausted = tonumber(R.att) >= tonumber(R.max)

if is_terminal(st) then
  return reply(C_REPLAY, '')
end

if st == ST_PENDING then
  -- Proven not applied: claim again, or fail for good when out of attempts.
  if exhausted then
    set_outcome('', '', 'RETRIES_EXHAUSTED', 'the policy allows ' .. R.max .. ' attempts')
    finish(ST_FAILED, 'RETRIES_EXHAUSTED', '')
    return reply(C_REPLAY, '')
  end
  return claim('CLAIMED')
end

if st == ST_RUNNING then
  local lease_end = tonumber(R.lse)
  if lease_end > NOW then
    if R.hld == holder then
      return reply(C_EXECUTE, '')
    end
    return reply(C_IN_PROGRESS, tostr(lease_end - NOW))
  end
  -- The lease expired: the worker may have applied the effect and died.
  if R.eff == EFF_IRREVERSIBLE then
    transition(ST_UNKNOWN, 'LEASE_EXPIRED', '')
    return reply(C_RECONCILE, '')
  end
  if exhausted then
    transition(ST_UNKNOWN, 'RETRIES_EXHAUSTED', '')
    return reply(C_RECONCILE, '')
  end
  return claim('RECLAIMED')
end

-- UNKNOWN: repeating is harmless only for idempotent and read-only tools,
-- and only while attempts remain; once escalated, only a human's finding
-- releases it, whatever its effect.
if R.eff == EFF_IRREVERSIBLE or exhausted or R.rev == '1' then
  return reply(C_RECONCILE, '')
end
return claim('RECLAIMED')
