-- run_end.lua: EndRun. Ends a running run as DONE (2) or CANCELLED (6);
-- the same end again answers OK, another is C_RUN_ENDED.
--
-- ARGV[2] -> state; ARGV[3] -> reason
--
-- Output: {C_OK, 'ended' | 'again', fields...}, {C_RUN_ENDED, '' |
-- 'deadline' (ended now by its deadline), fields...} or {C_NOT_FOUND, ''}.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {C_NOT_FOUND, ''}
end
if past_deadline() then
  return reply(C_RUN_ENDED, 'deadline')
end
local m = redis.call('HMGET', KEYS[1], 'st', 'rsn')
if num(m[1]) ~= RUNNING then
  if m[1] == ARGV[2] and m[2] == ARGV[3] then
    return reply(C_OK, 'again')
  end
  return reply(C_RUN_ENDED, '')
end
end_run(tonumber(ARGV[2]), ARGV[3])
return reply(C_OK, 'ended')
