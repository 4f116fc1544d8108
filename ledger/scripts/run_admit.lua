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
-- Output: {C_OK, 'new' | 'again'} (the caller needs no more of the run);
-- {C_UNGOVERNED, ''} for a run never started that no policy governs;
-- {C_RUN_ENDED, limit, fields...} when the run has ended (limit names the
-- limit that ended it now, or '').

local seen, rep = 'o:' .. ARGV[3], 'r:' .. ARGV[4] .. '\n' .. ARGV[5]

if redis.call('EXISTS', KEYS[1]) == 0 then
  -- Asked first: a run id no run governs is the cheapest answer.
  if ARGV[8] ~= '1' then
    return {C_UNGOVERNED, ''}
  end
  create(ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[2], '1')
end
-- What the decision reads, in one call.
local m = redis.call('HMGET', KEYS[1], seen, 'st', 'dl', 'ms', 'mr', 'mi', 'n', 'ni', 'top', 'open', rep)
if m[1] then
  return {C_OK, 'again'}
end
if past_deadline(m[2], m[3]) then
  return reply(C_RUN_ENDED, 'deadline')
end
if num(m[2]) ~= RUNNING then
  return reply(C_RUN_ENDED, '')
end
local ms, mr, mi, n, ni, top, open = num(m[4]), num(m[5]), num(m[6]), num(m[7]), num(m[8]), num(m[9]), num(m[10])
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
local same = num(m[11])
if limit > 0 and same >= limit then
  end_run(5, 'tool ' .. ARGV[4] .. ' called ' .. (same + 1) .. ' times with the same parameters (max_repeats ' .. limit .. ')')
  return reply(C_RUN_ENDED, 'max_repeats')
end
n, open, same = n + 1, open + 1, same + 1
if irreversible then
  ni = ni + 1
end
if same > top then
  top = same
end
redis.call('HSET', KEYS[1], seen, '1', rep, str(same), 'n', str(n), 'ni', str(ni), 'top', str(top), 'open', str(open))
if open <= 1 then
  -- No admitted operation was open: the record may have had an expiry.
  redis.call('PERSIST', KEYS[1])
end
return {C_OK, 'new'}
