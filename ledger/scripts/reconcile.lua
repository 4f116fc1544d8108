-- reconcile.lua: resolve an operation from what the destination system says
-- (contract.md §4, Reconcile).
--
-- KEYS[1..5] -> record, unresolved index, lease index, stats, overdue
--               (see common.lua)
-- ARGV[1] -> principal
-- ARGV[2] -> lease index member
-- ARGV[3] -> finding (1 APPLIED, 2 NOT_APPLIED, 3 ABANDON, 4 ESCALATE)
-- ARGV[4] -> result data (canonical JSON, '' for none), with APPLIED
-- ARGV[5] -> resource id ('' for none), with APPLIED
-- ARGV[6] -> failure code, with ABANDON ('' for the default, ABANDONED)
-- ARGV[7] -> failure message ('' for none)
-- ARGV[8] -> the reconciler's note ('' for none)
-- ARGV[9] -> the fencing token of the attempt the finding is about ('' for
--            whichever attempt is current)
--
-- Output: {code, aux, record, moved} (common.lua, reply) or {code, aux, ''}:
--   {C_OK, '', record}                 resolved (or already resolved the
--                                      same way)
--   {C_BUSY, ms, record}               a live lease holds it; it ends in ms
--   {C_ALREADY_RESOLVED, '', record}   terminal with another finding, or
--                                      with another result or failure
--   {C_STALE, state, ''}               ARGV[9] is not the current attempt's
--                                      token; or, without one, the history
--                                      holds the finding about an earlier
--                                      attempt only (below)
--   {C_NOT_FOUND, '', ''} / {C_EXPIRED, state, ''}
--
-- Accepted from UNKNOWN, from RUNNING past its lease, and from PENDING (where
-- APPLIED and ABANDON settle it, NOT_APPLIED leaves it PENDING with the
-- finding in its history and ESCALATE holds it for a human). APPLIED -> SUCCEEDED with the result; NOT_APPLIED
-- -> PENDING; ABANDON -> FAILED_FINAL; ESCALATE -> UNKNOWN, flagged for
-- review. A repeat of the same finding succeeds again without a second
-- history entry. On a terminal record the same finding is the same kind
-- with the same outcome as the one that stands: APPLIED on SUCCEEDED with
-- the same result data (canonical JSON, as stored; an empty object is the
-- same as none) and resource id, ABANDON
-- on FAILED_FINAL with the same failure code (ABANDONED when ARGV[6] is '')
-- and message; so is the repeat of a NOT_APPLIED or ESCALATE that took
-- effect before the record went terminal (below); anything else is
-- ALREADY_RESOLVED and changes nothing. With a token, a finding about an attempt that is no longer
-- the current one changes nothing (STALE).
--
-- A repeat of a call that took effect (the history holds its finding, made
-- by the same principal with the same note, about the attempt its token
-- names, or about the current attempt when it has none) answers OK and
-- changes nothing, whatever happened since: the worker of that attempt may
-- have reported UNKNOWN after the finding, and the repeat must not return
-- it to PENDING for another attempt to apply the effect again. A call
-- without a token whose finding the history holds about an earlier attempt
-- only cannot say which attempt it is about: a repeat of that finding,
-- after the next attempt applied the effect and ended UNKNOWN, or a new
-- finding about the current attempt. It is refused (STALE) and changes
-- nothing, rather than answered OK for a finding that did not touch the
-- current attempt. A new finding about the same attempt after that must
-- differ from the recorded one in its note (or come from another
-- principal), or name the attempt's token.

local finding, note, token = ARGV[3], ARGV[8], ARGV[9]
local REASON = ({'RECONCILED_APPLIED', 'RECONCILED_NOT_APPLIED', 'ABANDONED', 'ESCALATED'})[tonumber(finding)]

if not load() then
  return missing()
end
local st = R.st
if st == ST_SUCCEEDED or st == ST_FAILED then
  -- The same finding is the same kind with the outcome that stands, however
  -- the record got there (Complete, an earlier finding, RETRIES_EXHAUSTED):
  -- OK must never tell a reconciler that the ledger holds what it reported
  -- when it holds something else.
  if finding == '1' and st == ST_SUCCEEDED then
    -- An empty object is no data: clients differ in which they send.
    local function data(d)
      if d == nil or d == '{}' then return '' end
      return d
    end
    if data(R.rd) == data(ARGV[4]) and (R.rid or '') == ARGV[5] then
      return reply(C_OK, '')
    end
  elseif finding == '3' and st == ST_FAILED then
    local code = ARGV[6]
    if code == '' then code = 'ABANDONED' end
    if (R.fc or '') == code and (R.fm or '') == ARGV[7] then
      return reply(C_OK, '')
    end
  elseif (finding == '2' or finding == '4') and did(token ~= '' and token or R.tok, REASON, S.principal, note) then
    -- A repeat of a NOT_APPLIED or ESCALATE that took effect before the
    -- operation went on to this state: it answers as the call it repeats
    -- did, and changes nothing.
    return reply(C_OK, '')
  end
  return reply(C_ALREADY_RESOLVED, '')
end
if token == '' then token = nil end
if did(token or R.tok, REASON, S.principal, note) then
  return reply(C_OK, '')
end
if not token and did(nil, REASON, S.principal, note) then
  return {C_STALE, st, ''} -- the finding of an earlier attempt (above)
end
if token and R.tok ~= token then
  return {C_STALE, st, ''}
end
if st == ST_RUNNING and tonumber(R.lse) > NOW then
  return reply(C_BUSY, tostr(tonumber(R.lse) - NOW))
end

if finding == '1' then
  set_outcome(ARGV[4], ARGV[5], '', '')
  finish(ST_SUCCEEDED, 'RECONCILED_APPLIED', note)
elseif finding == '3' then
  local code = ARGV[6]
  if code == '' then code = 'ABANDONED' end
  set_outcome('', '', code, ARGV[7])
  finish(ST_FAILED, 'ABANDONED', note)
elseif finding == '2' then
  -- From PENDING too (already claimable) the finding gets its history
  -- entry, so that a repeat after the next attempt ended UNKNOWN is
  -- recognised and does not return that attempt to PENDING.
  transition(ST_PENDING, 'RECONCILED_NOT_APPLIED', note)
else
  if not (st == ST_UNKNOWN and R.rev == '1') then
    set('rev', '1')
    transition(ST_UNKNOWN, 'ESCALATED', note)
  end
end
return reply(C_OK, '')
