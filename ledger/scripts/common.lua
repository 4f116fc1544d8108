-- common.lua: the helpers every ledger script starts with. scripts.go runs
-- each script in one of two forms (docs/design.md, "How a script reaches
-- Redis"): this file, begin() and the script's body as one text (EVALSHA),
-- or the body as a function of a library that holds this file once (FCALL).
-- Nothing here may keep state from one call to the next but what begin()
-- sets anew.
--
-- Conventions shared by all write scripts:
--
--   KEYS[1] -> the operation record (string)        <prefix>:{sNN}:op:<tenant>:<id>
--   KEYS[2] -> the tenant's unresolved index (zset) <prefix>:{sNN}:unresolved:<tenant>
--   KEYS[3] -> the shard's lease index (zset)       <prefix>:{sNN}:leases
--   KEYS[4] -> the shard's live counts (hash)       <prefix>:{sNN}:stats
--   KEYS[5] -> the shard's UNKNOWN operations by recovery deadline (zset)
--                                                   <prefix>:{sNN}:overdue
--   ARGV[1] -> the principal recorded in the history
--   ARGV[2] -> the operation's member in the lease index (<tenant>:<id>, encoded)
--
-- The stats hash counts the shard's non-terminal operations by
-- "<tool>|<state>|<tenant>" (a field at 0 stays until prune.lua deletes
-- it; one below 0 is a drift from the records and stays, see bump); the
-- overdue zset holds
-- "<state>|<effect>|<tool>|<tenant>:<id>" scored by when the operation is
-- overdue if nothing moves it: UNKNOWN since + recovery window, PENDING
-- since + recovery window, and (added by expire.lua) an idempotent or
-- read-only claim's lease end + recovery window. Both are maintained by
-- transition() and finish(), so the metrics read them instead of scanning
-- records.
--
-- A number goes to redis.call as the string tostr makes of it: Redis would
-- format it with %.17g, which costs more (docs/benchmarks.md §6.15).
--
-- All five keys share one hash tag, so a script runs unchanged on Redis
-- Cluster. Every script validates everything before its first write and
-- raises no error after it, so a refused script (e.g. OOM under maxmemory,
-- which Redis reports on the first write) changes nothing. The time is the
-- store's (TIME), the one clock shared by every ledger instance.
--
-- The record (R below, all values strings as documented in design.md):
--   st state (1 PENDING, 2 RUNNING, 3 SUCCEEDED, 4 FAILED_FINAL, 5 UNKNOWN)
--   tool, fp (fingerprint, 32 bytes), pmt (permit), eff (1 READ_ONLY,
--   2 IDEMPOTENT, 3 IRREVERSIBLE), att (attempt), tok (fencing token), hld
--   (holder of the live claim), lse (lease end, ms), run, stp (run id, with
--   a leading \1 when the run guard admitted it; step),
--   ct / ut (created / updated, ms), ru (retain_until, ms), rue (retain_until
--   plus grace, ms), rsn (reason of the latest transition), rev ("1" when
--   escalated to a human), uks (UNKNOWN since, ms), rd / rid (result data
--   JSON, or a final failure's detail; resource id), fc / fm (failure code,
--   message), ctk / cdg (token and
--   outcome digest of the latest accepted Complete; '=' when the record is
--   terminal with that report's outcome, complete.lua), exp (when a terminal
--   record expires, ms), and the policy bound at creation: lms (lease),
--   max (max attempts), ret (retention), tret (tombstone retention),
--   rwin (recovery window; lms and rwin dropped by finish), cf / cfh (the consequential fields the
--   fingerprint covers, a JSON list, and its digest; absent when it covers
--   all parameters), cmp (the operation this one compensates), cby (the
--   compensations of this one, ids joined by \252), hb (the history chain's value before the
--   oldest entry kept, 40 hex digits; absent while no entry was dropped). S.hist holds the
--   history, at most 50 entries (HISTORY_LIMIT, HistoryLimit in types.go).
--
-- Stored form: one string per operation, with the history in it, and the
-- tombstone too: a terminal record lives until exp + tret, and from exp on
-- load() reports it as expired (only its final state is ever read again).
-- The compaction pass (compact.lua) then cuts it to its tombstone, the
-- fingerprint, the first four fields (st, exp, ct, ut), an empty attempt,
-- cf and the history chain's head, keeping its TTL.
-- ledger/record.go decodes the same form; docs/design.md §2 describes it.
--
--   'L' <fp: 32 bytes> <field> \255 <field> ... [\254 <entry>]...
--
-- Fields, in this order (trailing empty ones left out): st, exp (ms after
-- ut; empty in a terminal record when it is ret), ct (base 36), ut (ms
-- after ct), att, tok (after ct), eff, rsn (one letter, REASONS below),
-- tool, pmt, max, ret, tret, cdg (only while ctk = tok), rd, rid, fc, fm,
-- hld, lse (after ut), lms, rwin, uks (after ut), rev, run, stp, ru
-- (decimal ms), rue (after ru), cfh, cf, cmp, cby, hb: what a terminal
-- record keeps comes first, so its trailing fields are empty. Durations and time
-- differences are decimal milliseconds, or whole s/m/h/d with that suffix
-- ("7d"); a difference of 0 in ut, tok and the history is left empty. The
-- policy durations (lms, ret, tret, rwin) arrive from Go in that form and
-- stay in it in R too (ms() reads them).
-- Every other value is UTF-8 text the ledger validated, so the separator
-- bytes \252-\255 (never part of UTF-8) cannot occur in them.
--
-- A history entry is <from><to><reason letter><t> \253 <att> \253 <tok>
-- [\253 <principal> [\253 <detail>]] with t and tok after ct; the principal
-- is left out (or \252 when a detail follows) when it equals the previous
-- entry's.
--
-- The history chain (docs/receipts.md, "The history chain"; chain/chain.go): each entry's
-- value is redis.sha1hex of the previous value and the entry's time,
-- states, reason, attempt, token, principal and detail, joined by \255.
-- Nothing stores the values of kept entries (ledgerd computes them from
-- the entries); dropping the oldest entry folds it into hb, and the
-- tombstone keeps the head.

-- EVALSHA runs this whole text on every call, so the helpers below are
-- built in one table constructor and capture few upvalues (F, R, S, NOW):
-- each captured local costs a search at closure creation, which made the
-- prelude cost about as much as the commands of a Reserve. Inside F,
-- states are written as literals ('3' is SUCCEEDED). Redis's Lua hashes
-- every string a script makes, byte by byte, and tonumber converts twice:
-- the paths every cycle takes make few strings and let arithmetic convert
-- numbers (docs/benchmarks.md §6.21).

local ST_PENDING, ST_RUNNING, ST_SUCCEEDED, ST_FAILED, ST_UNKNOWN = '1', '2', '3', '4', '5'
local EFF_IRREVERSIBLE = '3'

-- Return codes, mapped one to one to Go values in scripts.go.
local C_OK, C_EXECUTE, C_REPLAY, C_IN_PROGRESS, C_RECONCILE = 0, 1, 2, 3, 4
local C_NOT_FOUND, C_EXPIRED, C_KEY_REUSED, C_STALE = 10, 11, 12, 13
local C_COMPLETION_CONFLICT, C_ALREADY_RESOLVED, C_BUSY, C_FIELDS, C_QUOTA = 14, 15, 16, 17, 18
local C_NOT_COMPENSABLE = 21

-- NOW is the store's time of the call (ms).
local NOW
-- R is the record as loaded, with every change applied.
local R
-- S is the rest of the script's state:
--   hist      the history as stored (each entry with its leading \254)
--   encoded   the stored form of R while it matches (nil: encode it)
--   ct36      the stored creation time
--   expired   the final state, when only the tombstone is left
--   entered   when the loaded record entered its state (for dwell times)
--   from, dwell  this call's transition, if it made one
--   principal, member, tenant  ARGV[1], ARGV[2] and the tenant part of it
local S

-- The letter each transition reason is stored as (record.go mirrors it).
local REASONS = {RESERVED = 'A', CLAIMED = 'B', RECLAIMED = 'C', SUCCEEDED = 'D', FAILED_FINAL = 'E',
  FAILED_RETRYABLE = 'F', MARKED_UNKNOWN = 'G', LEASE_EXPIRED = 'H', RETRIES_EXHAUSTED = 'I',
  RECONCILED_APPLIED = 'J', RECONCILED_NOT_APPLIED = 'K', ABANDONED = 'L', ESCALATED = 'M'}
-- REASON_NAMES is REASONS the other way round.
local REASON_NAMES = {A = 'RESERVED', B = 'CLAIMED', C = 'RECLAIMED', D = 'SUCCEEDED', E = 'FAILED_FINAL',
  F = 'FAILED_RETRYABLE', G = 'MARKED_UNKNOWN', H = 'LEASE_EXPIRED', I = 'RETRIES_EXHAUSTED',
  J = 'RECONCILED_APPLIED', K = 'RECONCILED_NOT_APPLIED', L = 'ABANDONED', M = 'ESCALATED'}

-- A stored record's fields: the first 16 (and the position after them), then
-- the other 17, of its body padded with separators. (FUNCTION LOAD runs this
-- without the string library, hence the literals.)
local FIELDS_HEAD = '^' ..
  '([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255' ..
  '([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255()'
local FIELDS_TAIL = '^' ..
  '([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255' ..
  '([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255([^\255]*)\255'
local FIELDS_PAD = '\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255\255'

-- A stored record's 12th field (ret), from its body's start.
local RET_FIELD = '^[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255[^\255\254]*\255([^\255\254]*)'

-- The ms in a unit of a duration's last byte (s, m, h, d).
local UNIT_MS = {[115] = 1000, [109] = 60000, [104] = 3600000, [100] = 86400000}

local F
F = {
  -- The history chain's value before an operation's first entry (chain.Genesis).
  GENESIS = '0000000000000000000000000000000000000000',

  -- begin starts a call: the time, an empty record and the state of ARGV.
  begin = function()
    local t = redis.call('TIME')
    -- Arithmetic converts TIME's strings, once each.
    local us = t[2] + 0
    NOW = t[1] * 1000 + (us - us % 1000) / 1000
    -- load() builds the whole record in one constructor; a new record
    -- takes only its tool.
    R = {}
    S = {hist = '', principal = ARGV[1], member = ARGV[2],
      tenant = string.match(ARGV[2] or '', '^[^:]*'), encoded = nil, ct36 = nil, entered = nil,
      from = nil, dwell = nil}
  end,

  tostr = function(n)
    return string.format('%d', n)
  end,

  -- ms decodes a duration or time difference ('' is 0). The embedded
  -- engine's tonumber gives nil past 2^63 where Redis gives the double;
  -- arithmetic converts the same in both.
  ms = function(s)
    if s == '' then return 0 end
    local u = UNIT_MS[string.byte(s, -1)]
    if u then return string.sub(s, 1, -2) * u end
    return tonumber(s) or string.find(s, '^%d+$') and s * 1 or 0
  end,

  -- enc encodes a whole number of ms, in the largest unit that divides it.
  enc = function(n)
    if n ~= 0 then
      if n % 86400000 == 0 then return string.format('%dd', n / 86400000) end
      if n % 3600000 == 0 then return string.format('%dh', n / 3600000) end
      if n % 60000 == 0 then return string.format('%dm', n / 60000) end
      if n % 1000 == 0 then return string.format('%ds', n / 1000) end
    end
    return string.format('%d', n)
  end,

  -- enc0 is enc with 0 left empty (for values that are always present).
  enc0 = function(n)
    if n == 0 then return '' end
    return F.enc(n)
  end,

  -- base36 writes a time in ms in base 36: 8 digits from 1972 to 2059.
  base36 = function(n)
    local s = ''
    while n >= 36 ^ 8 do
      local r = n % 36
      s = string.sub('0123456789abcdefghijklmnopqrstuvwxyz', r + 1, r + 1) .. s
      n = (n - r) / 36
    end
    local r1 = n % 36; n = (n - r1) / 36
    local r2 = n % 36; n = (n - r2) / 36
    local r3 = n % 36; n = (n - r3) / 36
    local r4 = n % 36; n = (n - r4) / 36
    local r5 = n % 36; n = (n - r5) / 36
    local r6 = n % 36; n = (n - r6) / 36
    local r7 = n % 36; n = (n - r7) / 36
    local r8 = n % 36
    return string.char(
      r8 < 10 and 48 + r8 or 87 + r8, r7 < 10 and 48 + r7 or 87 + r7,
      r6 < 10 and 48 + r6 or 87 + r6, r5 < 10 and 48 + r5 or 87 + r5,
      r4 < 10 and 48 + r4 or 87 + r4, r3 < 10 and 48 + r3 or 87 + r3,
      r2 < 10 and 48 + r2 or 87 + r2, r1 < 10 and 48 + r1 or 87 + r1) .. s
  end,

  reason_code = function(name)
    return REASONS[name]
  end,

  reason_name = function(code)
    return REASON_NAMES[code]
  end,

  -- chain folds the stored history entries h (each with its leading \254)
  -- of a record created at ct (ms) into the chain value prev. The oldest
  -- entry kept always names its principal. It returns nil when an entry
  -- is not one the ledger writes (a record that is no record).
  chain = function(prev, h, ct)
    local tostr, ms, p = F.tostr, F.ms, ''
    for e in string.gmatch(h, '\254([^\254]*)') do
      local from, to, r, t, att, tok, rest = string.match(e,
        '^([0-5])([0-5])([A-M])(%d*[smhd]?)\253(%d?%d?%d?%d?%d?%d?%d?%d?%d?)\253(%d*[smhd]?)(.*)$')
      if not from or #t > 13 or #tok > 13 or (t ~= '' and not string.find(t, '^%d')) or (tok ~= '' and not string.find(tok, '^%d')) then
        return nil
      end
      local ep, ed = string.match(rest, '^\253([^\253]*)$')
      if not ep then ep, ed = string.match(rest, '^\253([^\253]*)\253([^\253]*)$') end
      if not ep and rest ~= '' then return nil end
      if ep and ep ~= '\252' then p = ep end
      local tms, kms = ct + ms(t), ct + ms(tok)
      if tms >= 9007199254740992 or kms >= 9007199254740992 then return nil end
      prev = redis.sha1hex(table.concat({prev, tostr(tms), from, to, F.reason_name(r),
        tostr(tonumber(att) or 0), tostr(kms), p, ed or ''}, '\255'))
    end
    return prev
  end,

  -- chain_head returns the history chain's head of a stored record s: the
  -- one its tombstone keeps, or hb (or the genesis) folded with its
  -- history; nil for a record that is no record.
  chain_head = function(s)
    local h = string.find(s, '\254', 34, true)
    local v, n = {}, 0
    for f in string.gmatch(string.sub(s, 34, (h or (#s + 1)) - 1) .. '\255', '([^\255]*)\255') do
      n = n + 1
      v[n] = f
    end
    if v[5] == '' and n >= 6 then
      return v[7] or ''
    end
    local base, ct = v[33], tonumber(v[3] or '', 36)
    if not base or base == '' then base = F.GENESIS end
    if not ct then return nil end
    return F.chain(base, h and string.sub(s, h) or '', ct)
  end,

  -- entry_principal returns the principal an encoded history entry names
  -- (nil when it is the previous entry's).
  entry_principal = function(e)
    local _, _, p = string.find(e, '^[^\253]*\253[^\253]*\253[^\253]*\253([^\253]*)')
    if p == '\252' then return nil end
    return p
  end,

  -- last_principal is the principal of the latest history entry.
  last_principal = function()
    if not string.find(S.hist, '\254', 2, true) then
      -- No entry, or one: it names its principal.
      local _, _, p = string.find(S.hist, '^\254[^\253]*\253[^\253]*\253[^\253]*\253([^\253]*)')
      return p
    end
    local p
    for e in string.gmatch(S.hist, '\254([^\254]*)') do
      p = F.entry_principal(e) or p
    end
    return p
  end,

  -- did reports whether the history holds a transition for the given reason
  -- made while the given fencing token was current (while any was, when
  -- token is nil), and, when principal is given, made by that principal with
  -- that detail: how a repeated call recognises its own earlier effect, also
  -- after the record has moved on. The latest HISTORY_LIMIT entries count.
  did = function(token, reason, principal, detail)
    local code = F.reason_code(reason)
    local tok = token and F.enc0((tonumber(token) or 0) - tonumber(R.ct))
    local p
    for e in string.gmatch(S.hist, '\254([^\254]*)') do
      local r, k, rest = string.match(e, '^..(.)[^\253]*\253[^\253]*\253([^\253]*)(.*)$')
      -- rest: '', or \253 <principal> [\253 <detail>], or \253 \252 \253 <detail>
      -- (the principal left out when it is the previous entry's).
      local ep, ed = string.match(rest, '^\253([^\253]*)\253?(.*)$')
      if ep and ep ~= '\252' then p = ep end
      if r == code and (not tok or k == tok) and (not principal or (p == principal and (ed or '') == detail)) then
        return true
      end
    end
    return false
  end,

  -- entry encodes one history entry (with its leading \254); prev is the
  -- previous entry's principal.
  entry = function(from, to, reason, t, att, tok, p, detail, prev)
    local ct = tonumber(R.ct)
    local e = '\254' .. from .. to .. F.reason_code(reason) .. F.enc0(t - ct) .. '\253' .. att .. '\253' .. F.enc0(tok - ct)
    if p ~= prev then
      e = e .. '\253' .. p
      if detail ~= '' then e = e .. '\253' .. detail end
    elseif detail ~= '' then
      e = e .. '\253\252\253' .. detail
    end
    return e
  end,

  -- history records the transition from -> to (written by the next flush)
  -- and keeps the latest HISTORY_LIMIT = 50 entries.
  history = function(from, to, reason, detail)
    S.from = from or '0'
    S.dwell = S.entered and (NOW - S.entered) or 0
    local hist = S.hist .. F.entry(from or '0', to, reason, NOW, R.att, tonumber(R.tok), S.principal, detail or '', F.last_principal())
    -- An entry takes at least 6 bytes: a shorter history has at most 50.
    if #hist >= 306 and select(2, string.gsub(hist, '\254', '')) > 50 then
      -- Drop the oldest entry, folded into hb; the next one may name its
      -- principal only by reference to it.
      local cut = string.find(hist, '\254', 2, true)
      R.hb = F.chain(R.hb or F.GENESIS, string.sub(hist, 1, cut - 1), tonumber(R.ct)) or R.hb
      local p = F.entry_principal(string.sub(hist, 2, cut - 1))
      local nxt = string.find(hist, '\254', cut + 1, true) or (#hist + 1)
      local second = string.sub(hist, cut + 1, nxt - 1)
      if p and F.entry_principal(second) == nil then
        local head, tail = string.match(second, '^([^\253]*\253[^\253]*\253[^\253]*)(.*)$')
        second = head .. '\253' .. p .. string.sub(tail, 3)
      end
      hist = '\254' .. second .. string.sub(hist, nxt)
    end
    S.hist = hist
  end,

  -- stored_exp returns the exp field of a stored record s in state st as
  -- it reads: a terminal record's empty exp is its retention.
  stored_exp = function(s, st, exp)
    if exp == '' and (st == '3' or st == '4') then
      return string.match(s, RET_FIELD, 34) or ''
    end
    return exp
  end,

  -- gone is the one rule for an expired record: terminal (st), and past
  -- its retention (exp, ms) or compacted (compact.lua leaves no attempt),
  -- whatever the clock says then. Only its tombstone counts from then on.
  gone = function(st, exp, att)
    return (st == '3' or st == '4') and (att == '' or exp < NOW)
  end,

  -- load reads the record (stored: the record as a GET of it returned, when
  -- the caller read it already). It returns false when there is none, with
  -- S.expired set when only its tombstone is left (and R.fp its
  -- fingerprint; S.tcf the consequential fields of a compacted tombstone
  -- that keeps them, '' for all parameters).
  load = function(stored)
    local s = stored
    if s == nil then
      s = redis.call('GET', KEYS[1])
    end
    if not s then
      return false
    else
      local h = string.find(s, '\254', 34, true)
      local body
      if h then
        S.hist = string.sub(s, h)
        body = string.sub(s, 34, h - 1)
      else
        body = string.sub(s, 34)
      end
      local padded = body .. FIELDS_PAD
      local v = {string.match(padded, FIELDS_HEAD)}
      local tail = {string.match(padded, FIELDS_TAIL, v[17])}
      for i = 1, 17 do v[16 + i] = tail[i] end
      if v[5] == '' and select(2, string.gsub(body, '\255', '')) >= 5 then
        -- A compacted tombstone: st, exp, ct, ut, no attempt, cf, chain head.
        S.tcf, v[6], v[7] = v[6], '', ''
      end
      local ms, tostr = F.ms, F.tostr
      S.ct36 = v[3]
      local ct = tonumber(v[3], 36)
      local ut = ct + ms(v[4])
      local tok = tostr(ct + ms(v[6]))
      local exp
      if v[2] ~= '' then
        exp = tostr(ut + ms(v[2]))
      elseif v[1] == '3' or v[1] == '4' then
        exp = tostr(ut + ms(v[12]))
      end
      -- One constructor sizes the table once; an empty field is nil.
      R = {fp = string.sub(s, 2, 33), st = v[1], ct = tostr(ct), ut = tostr(ut), att = v[5], tok = tok,
        eff = v[7], rsn = F.reason_name(v[8]), tool = v[9], pmt = v[10], max = v[11], ret = v[12],
        tret = v[13], exp = exp, ctk = v[14] ~= '' and tok or nil, cdg = v[14] ~= '' and v[14] or nil,
        rd = v[15] ~= '' and v[15] or nil, rid = v[16] ~= '' and v[16] or nil,
        fc = v[17] ~= '' and v[17] or nil, fm = v[18] ~= '' and v[18] or nil,
        hld = v[19] ~= '' and v[19] or nil, lse = v[20] ~= '' and tostr(ut + ms(v[20])) or nil,
        lms = v[21], rwin = v[22], uks = v[23] ~= '' and tostr(ut + ms(v[23])) or nil,
        rev = v[24] ~= '' and v[24] or nil, run = v[25] ~= '' and v[25] or nil,
        stp = v[26] ~= '' and v[26] or nil, ru = v[27] ~= '' and v[27] or nil,
        rue = v[27] ~= '' and tostr(tonumber(v[27]) + ms(v[28])) or nil,
        cfh = v[29] ~= '' and v[29] or nil, cf = v[29] ~= '' and v[30] or nil,
        cmp = v[31] ~= '' and v[31] or nil, cby = v[32] ~= '' and v[32] or nil,
        hb = v[33] ~= '' and v[33] or nil}
      S.encoded = s
    end
    if F.gone(R.st, tonumber(R.exp), R.att) then
      S.expired = R.st
      return false
    end
    S.entered = tonumber(R.uks or R.ut)
    return true
  end,

  -- encode returns the stored form of R and its history.
  encode = function()
    local ct, ut = tonumber(R.ct), tonumber(R.ut)
    local enc, enc0 = F.enc, F.enc0
    local exp, lse, uks, ru, rue, cdg = '', '', '', '', '', ''
    if R.exp then
      -- Left empty when it is the retention after the last change.
      local d = tonumber(R.exp) - ut
      if d ~= F.ms(R.ret) then exp = enc(d) end
    end
    if R.lse then lse = enc(tonumber(R.lse) - ut) end
    if R.uks then uks = enc(tonumber(R.uks) - ut) end
    if R.ru then ru, rue = R.ru, enc(tonumber(R.rue) - tonumber(R.ru)) end
    if R.cdg and R.ctk == R.tok then cdg = R.cdg end
    local v = {
      R.st, exp, S.ct36 or F.base36(ct), enc0(ut - ct), R.att, enc0(tonumber(R.tok) - ct),
      R.eff, F.reason_code(R.rsn), R.tool, R.pmt, R.max, R.ret, R.tret,
      cdg, R.rd or '', R.rid or '', R.fc or '', R.fm or '', R.hld or '', lse, R.lms or '',
      R.rwin or '', uks, R.rev or '', R.run or '', R.stp or '', ru, rue, R.cfh or '', R.cf or '',
      R.cmp or '', R.cby or '', R.hb or '',
    }
    local n = 33
    while v[n] == '' do n = n - 1 end
    return 'L' .. R.fp .. table.concat(v, '\255', 1, n) .. S.hist
  end,

  -- flush writes the record: a terminal one with the TTL that keeps it (as
  -- its tombstone) until exp + tret, a live one without any.
  flush = function()
    local s = F.encode()
    if R.st == '3' or R.st == '4' then
      redis.call('SET', KEYS[1], s, 'PX', F.tostr(tonumber(R.exp) - NOW + F.ms(R.tret)))
    else
      redis.call('SET', KEYS[1], s)
    end
    S.encoded = s
  end,

  -- reply is a script's answer with the record: {code, aux, record, moved},
  -- moved being "<state left>:<ms spent in it>" after a transition ('0' as
  -- the state left by a new record), else ''; the ms may come encoded as
  -- the record encodes a duration (complete.lua's in-place way).
  reply = function(code, aux)
    if not S.encoded then
      S.encoded = F.encode()
    end
    local moved = ''
    if S.from then
      moved = S.from .. ':' .. F.tostr(S.dwell)
    end
    return {code, aux, S.encoded, moved}
  end,

  -- bump moves the live count of the operation's state st by delta ('1'
  -- or '-1'). A count at 0 stays for the sweeper to prune (prune.lua), so
  -- a cycle costs no HDEL; one below 0 (the counts drifted from the
  -- records: a restore, a manual edit) is kept, for the metrics to show.
  bump = function(st, delta)
    if st == '3' or st == '4' then
      return
    end
    redis.call('HINCRBY', KEYS[4], R.tool .. '|' .. st .. '|' .. S.tenant, delta)
  end,

  -- overdue_member is the operation's member in the overdue index while
  -- it is in state st.
  overdue_member = function(st)
    return st .. '|' .. R.eff .. '|' .. R.tool .. '|' .. S.member
  end,

  -- indexes moves the live count and the overdue entry with a transition
  -- (from nil: a new record); lapsed: the claim left had outlived its
  -- lease, so the sweeper may have listed it as overdue.
  indexes = function(from, to, lapsed)
    if from == to then
      return
    end
    if from then F.bump(from, '-1') end
    F.bump(to, '1')
    if from == '1' or from == '5' or (lapsed and R.eff ~= '3') then
      redis.call('ZREM', KEYS[5], F.overdue_member(from))
    end
    if to == '5' then
      redis.call('ZADD', KEYS[5], F.tostr(tonumber(R.uks) + F.ms(R.rwin)), F.overdue_member(to))
    elseif to == '1' then
      redis.call('ZADD', KEYS[5], F.tostr(NOW + F.ms(R.rwin)), F.overdue_member(to))
    end
  end,

  -- lapsed reports whether the record is a claim past its lease.
  lapsed = function()
    return R.st == '2' and tonumber(R.lse or '0') <= NOW
  end,

  -- transition moves a live record to a non-terminal state (or records a
  -- change within one, like an escalation), with the common bookkeeping,
  -- and writes it with its history entry.
  transition = function(to, reason, detail)
    local from, lapsed = R.st, F.lapsed()
    R.st, R.rsn, R.ut = to, reason, F.tostr(NOW)
    if to ~= '2' then
      R.lse, R.hld = nil, nil
    end
    if to == '5' then
      if from ~= '5' then
        R.uks = R.ut
      end
    else
      R.uks, R.rev = nil, nil
    end
    F.history(from, to, reason, detail)
    F.flush()
    F.indexes(from, to, lapsed)
    if to ~= '2' then
      redis.call('ZREM', KEYS[3], S.member)
    end
  end,

  -- umember is a member of the unresolved index: the creation time c36
  -- (as base36 writes it) in 9 digits, so that the index's order is
  -- creation order until the year 5138, and the raw operation id.
  umember = function(c36, id)
    if #c36 < 9 then
      return '0' .. c36 .. ':' .. id
    end
    return c36 .. ':' .. id
  end,

  -- unresolved_member is the operation's member in the unresolved index
  -- (umember), its id the lease member's id part, percent-decoded.
  unresolved_member = function()
    local id = string.match(S.member, '^[^:]*:(.*)$')
    id = string.gsub(id, '%%(%x%x)', function(x) return string.char(tonumber(x, 16)) end)
    return F.umember(S.ct36 or F.base36(tonumber(R.ct)), id)
  end,

  -- finish moves a record to a terminal state: it leaves the indexes,
  -- expires after max(retention, retain_until + grace), and stays as its
  -- own tombstone for the tombstone retention after that.
  finish = function(to, reason, detail)
    local from, lapsed = R.st, F.lapsed()
    local ttl = F.ms(R.ret)
    local rue = tonumber(R.rue or '0')
    if rue - NOW > ttl then
      ttl = rue - NOW
    end
    R.st, R.rsn, R.ut, R.exp = to, reason, F.tostr(NOW), F.tostr(NOW + ttl)
    -- What only a live record needs goes: the claim, UNKNOWN's marks, and
    -- the lease and recovery window of its policy.
    R.lse, R.hld, R.uks, R.rev, R.lms, R.rwin = nil, nil, nil, nil, nil, nil
    F.history(from, to, reason, detail)
    F.flush()
    F.indexes(from, to, lapsed)
    redis.call('ZREM', KEYS[2], F.unresolved_member())
    redis.call('ZREM', KEYS[3], S.member)
  end,

  -- missing answers for an operation without a record: expired (its
  -- tombstone says how it ended) or never seen.
  missing = function()
    if S.expired then
      return {11, S.expired, ''} -- C_EXPIRED
    end
    return {10, '', ''} -- C_NOT_FOUND
  end,

  -- set_outcome records a result or a failure (empty strings clear it).
  set_outcome = function(data, resource_id, fcode, fmsg)
    R.rd, R.rid, R.fc, R.fm = nil, nil, nil, nil
    if data ~= '' then R.rd = data end
    if resource_id ~= '' then R.rid = resource_id end
    if fcode ~= '' then R.fc = fcode end
    if fmsg ~= '' then R.fm = fmsg end
  end,
}

-- What the scripts use.
local tostr, ms, load, flush, reply, missing = F.tostr, F.ms, F.load, F.flush, F.reply, F.missing
local transition, finish, set_outcome, did = F.transition, F.finish, F.set_outcome, F.did
local lapsed, overdue_member, begin = F.lapsed, F.overdue_member, F.begin

local function set(field, value)
  R[field] = value
end

local function is_terminal(st)
  return st == '3' or st == '4' -- SUCCEEDED, FAILED_FINAL
end
