-- complete.lua: the claim holder reports how its attempt ended (contract.md §4,
-- Complete).
--
-- KEYS[1..5] -> record, unresolved index, lease index, stats, overdue
--               (see common.lua)
-- ARGV[1] -> principal
-- ARGV[2] -> lease index member
-- ARGV[3] -> fencing token of the attempt (decimal digits)
-- ARGV[4] -> outcome (1 SUCCEEDED, 2 FAILED_FINAL, 3 FAILED_RETRYABLE)
-- ARGV[5] -> digest of the outcome (outcome, result, failure), 16 hex digits
-- ARGV[6] -> result data (canonical JSON) or, with FAILED_FINAL, the
--            failure's detail ('' for none)
-- ARGV[7] -> resource id ('' for none)
-- ARGV[8] -> failure code ('' for none)
-- ARGV[9] -> failure message ('' for none)
-- ARGV[10] -> operation id (raw), for the unresolved index member
--
-- Output: {code, aux, record, moved} (common.lua, reply) or {code, aux, ''}:
--   {C_OK, '', record}                    recorded (or already recorded the
--                                         same way)
--   {C_STALE, state, ''}                  the token is not the current one
--   {C_COMPLETION_CONFLICT, '', record}   another outcome is already recorded
--   {C_NOT_FOUND, '', ''} / {C_EXPIRED, state, ''}
--
-- Accepted from RUNNING, from UNKNOWN (a late but authoritative report) and
-- from PENDING when the token is still the latest (a reconciler found
-- nothing yet the attempt did finish): refusing that report would let the
-- next claim apply the effect twice. For the same reason a success reported
-- with the latest token turns a FAILED_FINAL the ledger concluded on its own
-- (RETRIES_EXHAUSTED, ABANDONED) into SUCCEEDED. A repeat with the same token
-- and outcome succeeds again without a second history entry, also a repeat
-- of a retryable failure after the next attempt has claimed the operation
-- (recognised from the history: the attempt's FAILED_RETRYABLE entry).
--
-- A terminal record whose outcome is the accepted report's stores '=' for
-- its digest (SAME): a repeat then compares the outcome itself.

local token, outcome, digest = ARGV[3], ARGV[4], ARGV[5]
local SAME = '='

-- reported reports whether the record holds this call's outcome as its own.
local function reported()
  return ((outcome == '1' and R.st == ST_SUCCEEDED) or (outcome == '2' and R.st == ST_FAILED)) and
    (R.rd or '') == ARGV[6] and (R.rid or '') == ARGV[7] and (R.fc or '') == ARGV[8] and (R.fm or '') == ARGV[9]
end

-- in_place records the common report, the live claim's first report of
-- SUCCEEDED or FAILED_FINAL, on the stored record s without decoding it
-- into R: the fields a finish changes are written anew, the others copied
-- as stored. It gives the same record, indexes and reply as load() and
-- finish() below (ledger/scripts_test.go holds them equal); any other
-- record it leaves to them, returning nil before it has changed anything.
local function in_place(s)
  local h = string.find(s, '\254', 34, true) or (#s + 1)
  if #s - h + 1 >= 300 then
    return nil -- maybe 50 history entries: the oldest may have to go
  end
  -- A claim (st 2) with no expiry, digest, UNKNOWN mark or escalation
  -- (exp, cdg, uks, rev empty) and an attempt: of its first 22 fields, the
  -- ones this report keeps or reads (ct, ut, att, tok, eff, 9 to 13 from
  -- tool to tret as one span with tool, ret and tret in it, lse), and where
  -- field 22 ends. Any other record does not match.
  local ct36, ut, att, tok, eff, mid, tool, ret, tret, lse, q = string.match(s,
    '^2\255\255([^\255\254]*)\255([^\255\254]*)\255([^\255\254]+)\255([^\255\254]*)\255([^\255\254]*)\255[^\255\254]*\255(([^\255\254]*)\255[^\255\254]*\255[^\255\254]*\255([^\255\254]*)\255([^\255\254]*))\255\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255([^\255\254]*)\255[^\255\254]*\255[^\255\254]*()', 34)
  local ct = tonumber(ct36 or '', 36)
  if not ct or ct + ms(tok) ~= token + 0 then
    return nil
  end
  local tail = ''
  if q < h then
    local a, b, c = string.byte(s, q, q + 2)
    if a ~= 255 or b ~= 255 or c ~= 255 then
      return nil -- an UNKNOWN mark or an escalation
    end
    if q + 3 < h then
      tail = string.sub(s, q + 3, h - 1)
      local ru, rue, cfh, cf = string.match(tail .. '\255\255\255\255\255\255\255\255\255',
        '^[^\255]*\255[^\255]*\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255')
      if ru ~= '' or rue ~= '' or (cfh == '' and cf ~= '') or select(2, string.gsub(tail, '\255', '')) > 8 then
        return nil -- a retain_until, or fields finish() would not copy as stored
      end
    end
  end
  local to, reason, letter = ST_SUCCEEDED, 'SUCCEEDED', 'D'
  if outcome == '2' then
    to, reason, letter = ST_FAILED, 'FAILED_FINAL', 'E'
  end
  local updated = ct + ms(ut)
  local lapsed = lse == '' or updated + ms(lse) <= NOW
  R = {ct = ct, tool = tool, eff = eff}
  S.hist = string.sub(s, h)
  -- The record is built as one string: the separators before the outcome's
  -- fields and the tail go with trailing empty fields.
  local rd, rid, fc, fm = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
  local s1, s2, s3, s4, s5 = '\255', '\255', '\255', '\255', '\255\255\255\255\255\255\255'
  if tail == '' then
    s5 = ''
    if fm == '' then s4 = '' end
    if s4 == '' and fc == '' then s3 = '' end
    if s3 == '' and rid == '' then s2 = '' end
    if s2 == '' and rd == '' then s1 = '' end
  end
  local d, k = F.enc0(NOW - ct), F.enc0(ms(tok))
  -- The history entry, as F.entry writes it (inline: its own strings
  -- cost 6,500 instructions per cycle), naming the principal unless the
  -- latest entry does.
  local ps, p = '', ''
  if S.principal ~= F.last_principal() then
    ps, p = '\253', S.principal
  end
  local rec = string.sub(s, 1, 33) .. to .. '\255\255' .. ct36 .. '\255' .. d .. '\255' .. att .. '\255' .. k ..
    '\255' .. eff .. '\255' .. letter .. '\255' .. mid .. '\255' .. SAME .. s1 .. rd .. s2 .. rid .. s3 .. fc .. s4 ..
    fm .. s5 .. tail .. S.hist .. '\254' .. ST_RUNNING .. to .. letter .. d .. '\253' .. att .. '\253' .. k .. ps .. p
  redis.call('SET', KEYS[1], rec, 'PX', tostr(ms(ret) + ms(tret)))
  F.indexes(ST_RUNNING, to, lapsed)
  redis.call('ZREM', KEYS[2], F.umember(ct36, ARGV[10]))
  redis.call('ZREM', KEYS[3], S.member)
  -- reply()'s answer. The time in RUNNING is the history entry's d when
  -- the claim is the record's first (no updated time): moved takes a
  -- duration as the record encodes one.
  local dwelt = d
  if ut ~= '' then
    dwelt = tostr(NOW - updated)
  end
  return {C_OK, '', rec, ST_RUNNING .. ':' .. dwelt}
end

local stored = redis.call('GET', KEYS[1])
if stored and (outcome == '1' or outcome == '2') then
  local done = in_place(stored)
  if done then
    return done
  end
end
if not load(stored) then
  return missing()
end
if R.tok ~= token then
  if outcome == '3' and did(token, 'FAILED_RETRYABLE') then
    -- A repeat of the report that returned this attempt to PENDING, after
    -- the next attempt claimed it: it took effect, say so.
    return reply(C_OK, '')
  end
  return {C_STALE, R.st, ''}
end
if R.ctk == token then
  if R.cdg == digest or (R.cdg == SAME and reported()) then
    return reply(C_OK, '')
  end
  return reply(C_COMPLETION_CONFLICT, '')
end

local st = R.st
if st == ST_SUCCEEDED or st == ST_FAILED then
  -- Resolved by a reconciler or the ledger: the same kind of outcome agrees
  -- with it. The attempt's report is remembered, so that a different
  -- outcome with this token is a conflict, not a second answer.
  if (outcome == '1' and st == ST_SUCCEEDED) or (outcome == '2' and st == ST_FAILED) then
    set('ctk', token)
    set('cdg', digest)
    flush()
    return reply(C_OK, '')
  end
  if st == ST_SUCCEEDED then
    return reply(C_COMPLETION_CONFLICT, '')
  end
  if outcome == '1' and (R.rsn == 'RETRIES_EXHAUSTED' or R.rsn == 'ABANDONED') then
    -- The ledger (out of attempts) or a reconciler (abandon) concluded that
    -- the effect never happened; the attempt holding the latest token says
    -- it did. The record must not keep the lie.
    local was = R.rsn
    set('ctk', token)
    set('cdg', SAME)
    set_outcome(ARGV[6], ARGV[7], '', '')
    finish(ST_SUCCEEDED, 'SUCCEEDED', 'late report after ' .. was)
    return reply(C_OK, '')
  end
  return reply(C_COMPLETION_CONFLICT, '')
end

set('ctk', token)
set('cdg', outcome == '3' and digest or SAME)
set_outcome(ARGV[6], ARGV[7], ARGV[8], ARGV[9])
if outcome == '1' then
  finish(ST_SUCCEEDED, 'SUCCEEDED', '')
elseif outcome == '2' then
  finish(ST_FAILED, 'FAILED_FINAL', '')
else
  -- From PENDING too (already claimable) the report gets its history
  -- entry, so that a repeat after the next claim is recognised.
  transition(ST_PENDING, 'FAILED_RETRYABLE', '')
end
return reply(C_OK, '')
