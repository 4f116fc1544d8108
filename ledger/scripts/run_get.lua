-- run_get.lua: GetRun. A run whose deadline has passed is ended first.
--
-- Output: {C_OK, '' | 'deadline' (ended now), fields...} or {C_NOT_FOUND, ''}.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {C_NOT_FOUND, ''}
end
if past_deadline() then
  return reply(C_OK, 'deadline')
end
return reply(C_OK, '')
