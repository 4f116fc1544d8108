-- run_settle.lua: an admitted operation is known to be terminal, or not to
-- be the run's: it no longer holds the run's record. Repeats change nothing.
--
-- ARGV[2] -> operation id
--
-- Output: {C_OK, ''}.

local seen = 'o:' .. ARGV[2]
local m = redis.call('HMGET', KEYS[1], seen, 'st', 'open', 'dl', 'et', 'ret')
if m[1] == '1' then
  local st, open, dl, et, ret = num(m[2]), num(m[3]) - 1, num(m[4]), num(m[5]), num(m[6])
  redis.call('HSET', KEYS[1], seen, '0', 'open', str(open))
  if open <= 0 then
    -- The last open operation: the record may expire now.
    expire(st, open, dl, et, ret)
  end
end
return {C_OK, ''}
