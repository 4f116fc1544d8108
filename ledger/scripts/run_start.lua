-- run_start.lua: StartRun (contract.md §10). Creates the run, or finds it.
--
-- ARGV[2] -> principal; ARGV[3..6] -> max steps, deadline (ms), max repeats,
-- max irreversible steps (0: none); ARGV[7] -> retention after the end (ms)
--
-- Output: {C_OK, 'created' | 'exists', fields...}, or {C_KEY_REUSED, '',
-- fields...} when the run exists with other limits.

if redis.call('EXISTS', KEYS[1]) == 1 then
  local m = redis.call('HMGET', KEYS[1], 'ms', 'dd', 'mr', 'mi')
  for i = 1, 4 do
    if num(m[i]) ~= num(ARGV[i + 2]) then
      return reply(C_KEY_REUSED, '')
    end
  end
  return reply(C_OK, 'exists')
end
create(ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[2], '0')
return reply(C_OK, 'created')
