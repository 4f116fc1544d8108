-- lookup.lua: read one operation with its history, atomically (contract.md §3,
-- Lookup). Writes nothing.
--
-- KEYS[1..3] -> record, and the history list and tombstone of the previous
--               record layout (see common.lua)
-- ARGV[1] -> principal (unused)
-- ARGV[2] -> lease index member
--
-- Output:
--   {C_OK, '', record, ''}   the record in its stored form, history included
--   {C_NOT_FOUND, '', ''} / {C_EXPIRED, state, ''}
--
-- A record in the current form is returned as stored: only its state and,
-- when terminal, its expiry are decoded. A compacted tombstone (compact.lua:
-- an empty attempt after ut, or nothing after it) is expired whatever the
-- clock says.

local s = redis.pcall('GET', KEYS[1])
if type(s) == 'string' then
  local st, exp, ct, ut, more = string.match(s, '^(%d)\255([^\255]*)\255([^\255]*)\255([^\255\254]*)(.?.?)', 34)
  if st then
    if (st == ST_SUCCEEDED or st == ST_FAILED) and (more == '' or more == '\255\255' or tonumber(ct, 36) + ms(ut) + ms(exp) < NOW) then
      return {C_EXPIRED, st, ''}
    end
    return {C_OK, '', s, ''}
  end
end
if not load() then
  return missing()
end
return reply(C_OK, '')
