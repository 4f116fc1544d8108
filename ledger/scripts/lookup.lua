-- lookup.lua: read one operation with its history, atomically (SPEC §3,
-- Lookup). Writes nothing.
--
-- KEYS[1..3] -> record, history, tombstone (see common.lua)
-- ARGV: none used
--
-- Output:
--   {C_OK, '', record, history}   history: JSON entries, oldest first
--   {C_NOT_FOUND, '', {}} / {C_EXPIRED, tombstone, {}}

if not load() then
  return missing()
end
return {C_OK, '', snapshot(), redis.call('LRANGE', KEYS[2], 0, -1)}
