-- run_admit.lua: the run guard of a Reserve with a run id (design.md §3.5).
-- An operation id the run has admitted before passes and counts nothing; a
-- new one is a new step, admitted when every limit allows it, else the run
-- ends with the limit's state.
--
-- ARGV[2] -> principal; ARGV[3] -> operation id; ARGV[4] -> tool;
-- ARGV[5] -> fingerprint (32 bytes); ARGV[6] -> '1' when irreversible;
-- ARGV[7] -> the tool's own repeat limit (0: none); ARGV[8] -> '1' when the
-- policy governs runs never started, with ARGV[9..13] its max steps,
-- deadline (ms), max repeats, max irreversible steps and retention (ms).
--
-- Output: {C_OK, 'new' | 'again', fields...}; {C_UNGOVERNED, '', ...} for a
-- run never started that no policy governs; {C_RUN_ENDED, limit, fields...}
-- when the run has ended (limit names the limit that ended it now, or '').

if redis.call('EXISTS', KEYS[1]) == 0 then
  if ARGV[8] ~= '1' then
    return {C_UNGOVERNED, ''}
  end
  create(ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[2], '1')
end
local seen = 'o:' .. ARGV[3]
if redis.call('HGET', KEYS[1], seen) then
  return reply(C_OK, 'again')
end
if past_deadline() then
  return reply(C_RUN_ENDED, 'deadline')
end
local m = redis.call('HMGET', KEYS[1], 'st', 'ms', 'mr', 'mi', 'n', 'ni', 'top')
if num(m[1]) ~= RUNNING then
  return reply(C_RUN_ENDED, '')
end
local ms, mr, mi, n, ni, top = num(m[2]), num(m[3]), num(m[4]), num(m[5]), num(m[6]), num(m[7])
if ms > 0 and n >= ms then
  end_run(3, 'max_steps ' .. ms .. ' reached')
  return reply(C_RUN_ENDED, 'max_steps')
end
local irreversible = ARGV[6] == '1'
if irreversible and mi > 0 and ni >= mi then
  end_run(3, 'max_irreversible ' .. mi .. ' reached')
  return reply(C_RUN_ENDED, 'max_irreversible')
end
local limit = num(ARGV[7])
if mr > 0 and (limit == 0 or mr < limit) then
  limit = mr
end
local rep = 'r:' .. ARGV[4] .. '\n' .. ARGV[5]
local same = num(redis.call('HGET', KEYS[1], rep))
if limit > 0 and same >= limit then
  end_run(5, 'tool ' .. ARGV[4] .. ' called ' .. (same + 1) .. ' times with the same parameters (max_repeats ' .. limit .. ')')
  return reply(C_RUN_ENDED, 'max_repeats')
end
redis.call('HSET', KEYS[1], seen, '1', rep, str(same + 1))
redis.call('HINCRBY', KEYS[1], 'n', '1')
redis.call('HINCRBY', KEYS[1], 'open', '1')
if irreversible then
  redis.call('HINCRBY', KEYS[1], 'ni', '1')
end
if same + 1 > top then
  redis.call('HSET', KEYS[1], 'top', str(same + 1))
end
redis.call('PERSIST', KEYS[1])
return reply(C_OK, 'new')
