-- prune.lua: delete the live counts at 0 of one shard. A transition leaves
-- a count at 0 in place (common.lua, bump), so that an operation's cycle
-- costs no HDEL; the sweeper runs this now and then (Ledger.PruneCounts),
-- so a tool or tenant no longer used leaves no fields behind. A count that
-- is not 0 when the script runs stays, whatever it was when the sweeper
-- last read it.
--
-- KEYS[1] -> the shard's live counts (hash)   <prefix>:{sNN}:stats
-- ARGV: none
--
-- Output: how many fields it deleted.

local h = redis.call('HGETALL', KEYS[1])
local zero = {}
for i = 2, #h, 2 do
  if h[i] == '0' then
    zero[#zero + 1] = h[i - 1]
  end
end
-- unpack takes a bounded number of values: HDEL a thousand at a time.
for i = 1, #zero, 1000 do
  redis.call('HDEL', KEYS[1], unpack(zero, i, math.min(i + 999, #zero)))
end
return #zero
