-- runs.lua: the helpers every run script starts with (scripts.go runs
-- run_*.lua with it as common.lua's scripts with common.lua: begin() starts
-- each call).
--
--   KEYS[1] -> the run record (hash)               <prefix>:{sNN}:run:<tenant>:<run>
--   KEYS[2] -> the tenant's runs in the shard (zset) <prefix>:{sNN}:runs:<tenant>
--   ARGV[1] -> the run's member in KEYS[2] (the encoded run id)
--
-- The record's fields (all strings): st state (1 RUNNING, 2 DONE,
-- 3 STEP_LIMIT, 4 DEADLINE, 5 REPETITION, 6 CANCELLED), the limits ms (max
-- steps), dd (deadline, ms after the start), mr (max repeats), mi (max
-- irreversible steps), 0 for none; the counts n (steps), ni (irreversible
-- steps), top (the most steps of one tool with one fingerprint); ct (started,
-- ms), dl (deadline, ms; 0: none), et (ended, ms), rsn (why it ended), imp
-- ("1": started by its first Reserve under the policy), by (who started it),
-- open (admitted operations not known to be terminal), ret (retention after
-- the end, ms). Besides them: o:<operation id> for each admitted operation
-- ("1" open, "0" settled) and r:<tool>\n<fingerprint> its steps.
--
-- The index scores a running run -ct and an ended one 2^50 - et, so the
-- index in ascending order lists running runs first, newest first, then
-- ended ones, the latest ended first.
--
-- Each script replies {code, aux, <the fields of FIELDS, in order>}, or
-- {code, aux} where its caller needs no more (run_admit, run_settle).

local C_OK, C_NOT_FOUND, C_KEY_REUSED, C_RUN_ENDED, C_UNGOVERNED = 0, 10, 12, 19, 20
local RUNNING = 1
local ENDED_BASE = 1125899906842624 -- 2^50

local FIELDS = {'st', 'ms', 'dd', 'mr', 'mi', 'n', 'ni', 'top', 'ct', 'dl', 'et', 'rsn', 'imp', 'by', 'open', 'ret'}

-- NOW is the store's time of the call (ms), read by now() when first needed.
local NOW

-- begin starts a call.
local function begin()
  NOW = nil
end

-- now returns the store's time of the call (ms).
local function now()
  if not NOW then
    local t = redis.call('TIME')
    -- Arithmetic converts TIME's strings, once each (common.lua, begin).
    local us = t[2] + 0
    NOW = t[1] * 1000 + (us - us % 1000) / 1000
  end
  return NOW
end

-- num converts a stored number, 0 for a field that is absent: arithmetic
-- converts it once (tonumber twice), and a field that is no number raises
-- an error, so the scripts convert what they read before their first
-- write (run_admit, after create, only what create wrote). settle_ttl,
-- which reads after it, uses tonumber.
local function num(v)
  return v and v + 0 or 0
end

-- str writes a whole number for redis.call, which would format a number
-- argument with %.17g (common.lua, tostr).
local function str(n)
  return string.format('%d', n)
end

local function reply(code, aux)
  local out = {code, aux}
  local m = redis.call('HMGET', KEYS[1], unpack(FIELDS))
  for i = 1, #FIELDS do
    out[i + 2] = m[i] or ''
  end
  return out
end

-- expire gives the record the expiry the rules call for: none while an
-- admitted operation may be unresolved, or while the run has no end in
-- sight; else its retention after the end, or after the deadline.
local function expire(st, open, dl, et, ret)
  if open > 0 or (st == RUNNING and dl == 0) then
    redis.call('PERSIST', KEYS[1])
  elseif st == RUNNING then
    redis.call('PEXPIREAT', KEYS[1], str(dl + ret))
  else
    redis.call('PEXPIREAT', KEYS[1], str(et + ret))
  end
end

-- settle_ttl is expire() of the record as stored, after the script's
-- writes: a field that is no number reads as 0.
local function settle_ttl()
  local m = redis.call('HMGET', KEYS[1], 'st', 'open', 'dl', 'et', 'ret')
  expire(tonumber(m[1]) or 0, tonumber(m[2]) or 0, tonumber(m[3]) or 0, tonumber(m[4]) or 0, tonumber(m[5]) or 0)
end

-- end_run ends a running run in state st for reason.
local function end_run(st, reason)
  redis.call('HSET', KEYS[1], 'st', str(st), 'et', str(now()), 'rsn', reason)
  redis.call('ZADD', KEYS[2], str(ENDED_BASE - now()), ARGV[1])
  settle_ttl()
end

-- past_deadline ends a running run whose deadline has passed; st and dl
-- are its state and deadline as stored, read here when not given. It
-- returns whether it ended the run.
local function past_deadline(st, dl)
  if st == nil then
    local m = redis.call('HMGET', KEYS[1], 'st', 'dl')
    st, dl = m[1], m[2]
  end
  if num(st) == RUNNING and num(dl) > 0 and now() >= num(dl) then
    end_run(4, 'the deadline passed')
    return true
  end
  return false
end

-- create records a new running run with limits ms, dd, mr, mi, retention
-- ret, started by principal (implicit: by its first Reserve).
local function create(ms, dd, mr, mi, ret, principal, implicit)
  local dl = 0
  if num(dd) > 0 then
    dl = now() + num(dd)
  end
  redis.call('HSET', KEYS[1], 'st', '1', 'ms', ms, 'dd', dd, 'mr', mr, 'mi', mi, 'n', '0', 'ni', '0', 'top', '0',
    'ct', str(now()), 'dl', str(dl), 'et', '0', 'rsn', '', 'imp', implicit, 'by', principal, 'open', '0', 'ret', ret)
  redis.call('ZADD', KEYS[2], str(-now()), ARGV[1])
  settle_ttl()
end
