-- run_settle.lua: an admitted operation is known to be terminal, or not to
-- be the run's: it no longer holds the run's record. Repeats change nothing.
--
-- ARGV[2] -> operation id
--
-- Output: {C_OK, ''}.

local seen = 'o:' .. ARGV[2]
if redis.call('HGET', KEYS[1], seen) == '1' then
  redis.call('HSET', KEYS[1], seen, '0')
  redis.call('HINCRBY', KEYS[1], 'open', '-1')
  settle_ttl()
end
return {C_OK, ''}
