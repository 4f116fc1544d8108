-- common.lua: the helpers every ledger script starts with. scripts.go
-- prepends this file to each script, so every script is self-contained when
-- it reaches Redis (EVALSHA of the whole text).
--
-- Conventions shared by all write scripts:
--
--   KEYS[1] -> the operation record (hash)          <prefix>:{sNN}:op:<tenant>:<id>
--   KEYS[2] -> the operation history (list)         <prefix>:{sNN}:h:<tenant>:<id>
--   KEYS[3] -> the tombstone (string)               <prefix>:{sNN}:tomb:<tenant>:<id>
--   KEYS[4] -> the tenant's unresolved index (zset) <prefix>:{sNN}:unresolved:<tenant>
--   KEYS[5] -> the shard's lease index (zset)       <prefix>:{sNN}:leases
--   KEYS[6] -> the shard's live counts (hash)       <prefix>:{sNN}:stats
--   KEYS[7] -> the shard's UNKNOWN operations by recovery deadline (zset)
--                                                   <prefix>:{sNN}:overdue
--   ARGV[1] -> the principal recorded in the history
--   ARGV[2] -> the operation's member in the lease index (<tenant>:<id>, encoded)
--
-- The stats hash counts the shard's non-terminal operations by
-- "<tool>|<state>|<tenant>" (fields at 0 are deleted); the overdue zset holds
-- "<effect>|<tool>|<tenant>:<id>" scored by the recovery deadline while an
-- operation is UNKNOWN. Both are maintained by transition() and finish(), so
-- the metrics read them instead of scanning records.
--
-- All seven keys share one hash tag, so a script runs unchanged on Redis
-- Cluster. Every script validates everything before its first write and
-- raises no error after it, so a refused script (e.g. OOM under maxmemory,
-- which Redis reports on the first write) changes nothing. The time is the
-- store's (TIME), the one clock shared by every ledger instance.
--
-- Record fields (all strings):
--   st state (1 PENDING, 2 RUNNING, 3 SUCCEEDED, 4 FAILED_FINAL, 5 UNKNOWN)
--   tool, fp (fingerprint, hex), pmt (permit), eff (1 READ_ONLY, 2 IDEMPOTENT,
--   3 IRREVERSIBLE), att (attempt), tok (fencing token), hld (holder of the
--   live claim), lse (lease end, ms), run, stp (run id, step), ct / ut
--   (created / updated, ms), ru (retain_until, ms), rue (retain_until plus
--   grace, ms), rsn (reason of the latest transition), rev ("1" when escalated
--   to a human), uks (UNKNOWN since, ms), rd / rid (result data JSON,
--   resource id), fc / fm (failure code, message), ctk / cdg (token and
--   outcome digest of the latest accepted Complete), exp (when a terminal
--   record expires, ms), ix (member in the unresolved index), and the policy
--   bound at creation: lms (lease, ms), max (max attempts), ret (retention,
--   ms), tret (tombstone retention, ms), rwin (recovery window, ms), cf / cfh
--   (the consequential fields the fingerprint covers, a JSON list, and its
--   digest; absent when it covers all parameters).

local ST_PENDING, ST_RUNNING, ST_SUCCEEDED, ST_FAILED, ST_UNKNOWN = '1', '2', '3', '4', '5'
local EFF_IRREVERSIBLE = '3'
local HISTORY_LIMIT = 50

-- Return codes, mapped one to one to Go values in scripts.go.
local C_OK, C_EXECUTE, C_REPLAY, C_IN_PROGRESS, C_RECONCILE = 0, 1, 2, 3, 4
local C_NOT_FOUND, C_EXPIRED, C_KEY_REUSED, C_STALE = 10, 11, 12, 13
local C_COMPLETION_CONFLICT, C_ALREADY_RESOLVED, C_BUSY, C_FIELDS, C_QUOTA = 14, 15, 16, 17, 18

local PRINCIPAL, LEASE_MEMBER = ARGV[1], ARGV[2]
local TENANT = string.match(LEASE_MEMBER or '', '^[^:]*')

local function tostr(n)
  return string.format('%d', n)
end

local NOW
do
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- R is the record as loaded, with every change applied; CHANGED names the
-- fields flush() must write (or delete, when R[field] is nil).
local R = {}
local CHANGED = {}
-- ENTERED is when the loaded record entered its state (for dwell times);
-- MOVED_FROM and DWELL describe this call's transition, if it made one.
local ENTERED, MOVED_FROM, DWELL

local function load()
  local flat = redis.call('HGETALL', KEYS[1])
  if #flat == 0 then
    return false
  end
  for i = 1, #flat, 2 do
    R[flat[i]] = flat[i + 1]
  end
  ENTERED = tonumber(R.uks or R.ut)
  return true
end

local function set(field, value)
  R[field] = value
  CHANGED[field] = true
end

local function unset(field)
  if R[field] ~= nil then
    R[field] = nil
    CHANGED[field] = true
  end
end

local function flush()
  local hset, hdel = {}, {}
  for field in pairs(CHANGED) do
    if R[field] == nil then
      hdel[#hdel + 1] = field
    else
      hset[#hset + 1] = field
      hset[#hset + 1] = R[field]
    end
  end
  CHANGED = {}
  if #hset > 0 then
    redis.call('HSET', KEYS[1], unpack(hset))
  end
  if #hdel > 0 then
    redis.call('HDEL', KEYS[1], unpack(hdel))
  end
end

-- snapshot returns the record as a flat field/value list; after a
-- transition it adds _from (the state left, '0' for a new record) and _dwell
-- (ms spent in it), which are not stored.
local function snapshot()
  local flat = {}
  for field, value in pairs(R) do
    flat[#flat + 1] = field
    flat[#flat + 1] = value
  end
  if MOVED_FROM then
    flat[#flat + 1] = '_from'
    flat[#flat + 1] = MOVED_FROM
    flat[#flat + 1] = '_dwell'
    flat[#flat + 1] = tostr(DWELL)
  end
  return flat
end

-- count moves the operation's live count between states (nil: none).
local function count(from, to)
  if from == to then
    return
  end
  for _, change in ipairs({{from, -1}, {to, 1}}) do
    local st, delta = change[1], change[2]
    if st and st ~= ST_SUCCEEDED and st ~= ST_FAILED then
      local field = R.tool .. '|' .. st .. '|' .. TENANT
      if redis.call('HINCRBY', KEYS[6], field, delta) <= 0 then
        redis.call('HDEL', KEYS[6], field)
      end
    end
  end
end

local function overdue_member()
  return R.eff .. '|' .. R.tool .. '|' .. LEASE_MEMBER
end

local function history(from, to, reason, detail)
  MOVED_FROM = from or '0'
  DWELL = ENTERED and (NOW - ENTERED) or 0
  count(from, to)
  if from ~= ST_UNKNOWN and to == ST_UNKNOWN then
    redis.call('ZADD', KEYS[7], tonumber(R.uks) + tonumber(R.rwin), overdue_member())
  elseif from == ST_UNKNOWN and to ~= ST_UNKNOWN then
    redis.call('ZREM', KEYS[7], overdue_member())
  end
  redis.call('RPUSH', KEYS[2], cjson.encode({
    t = tostr(NOW), f = from, s = to, a = R.att, k = R.tok,
    p = PRINCIPAL, r = reason, d = detail or '',
  }))
  redis.call('LTRIM', KEYS[2], -HISTORY_LIMIT, -1)
end

-- transition moves a live record to a non-terminal state (or records a
-- change within one, like an escalation), with the common bookkeeping, and
-- writes it with its history entry.
local function transition(to, reason, detail)
  local from = R.st
  set('st', to)
  set('rsn', reason)
  set('ut', tostr(NOW))
  if to ~= ST_RUNNING then
    unset('lse')
    unset('hld')
  end
  if to == ST_UNKNOWN then
    if from ~= ST_UNKNOWN then
      set('uks', tostr(NOW))
    end
  else
    unset('uks')
    unset('rev')
  end
  flush()
  history(from, to, reason, detail)
  if to ~= ST_RUNNING then
    redis.call('ZREM', KEYS[5], LEASE_MEMBER)
  end
end

-- finish moves a record to a terminal state: it leaves the indexes, expires
-- after max(retention, retain_until + grace), and leaves a tombstone that
-- outlives it by the tombstone retention.
local function finish(to, reason, detail)
  local from = R.st
  local ttl = tonumber(R.ret)
  local rue = tonumber(R.rue or '0')
  if rue - NOW > ttl then
    ttl = rue - NOW
  end
  set('st', to)
  set('rsn', reason)
  set('ut', tostr(NOW))
  set('exp', tostr(NOW + ttl))
  unset('lse')
  unset('hld')
  unset('uks')
  unset('rev')
  flush()
  history(from, to, reason, detail)
  redis.call('ZREM', KEYS[4], R.ix)
  redis.call('ZREM', KEYS[5], LEASE_MEMBER)
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('SET', KEYS[3], to .. ':' .. R.fp, 'PX', ttl + tonumber(R.tret))
end

local function is_terminal(st)
  return st == ST_SUCCEEDED or st == ST_FAILED
end

-- missing answers for an operation without a record: expired (its tombstone
-- says how it ended) or never seen.
local function missing()
  local tomb = redis.call('GET', KEYS[3])
  if tomb then
    return {C_EXPIRED, tomb, {}}
  end
  return {C_NOT_FOUND, '', {}}
end

-- set_outcome records a result or a failure (empty strings clear a field).
local function set_outcome(data, resource_id, fcode, fmsg)
  for field, value in pairs({rd = data, rid = resource_id, fc = fcode, fm = fmsg}) do
    if value == '' then
      unset(field)
    else
      set(field, value)
    end
  end
end
