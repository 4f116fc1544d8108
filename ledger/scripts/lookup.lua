-- lookup.lua: read one operation with its history, atomically (contract.md §3,
-- Lookup). Writes nothing.
--
-- KEYS[1] -> record (see common.lua)
-- ARGV[1] -> principal (unused)
-- ARGV[2] -> lease index member
--
-- Output:
--   {C_OK, '', record, ''}   the record in its stored form, history included
--   {C_NOT_FOUND, '', ''} / {C_EXPIRED, '<state>:<history chain head>', ''}
--
-- The record is returned as stored: only its state and, when terminal, its
-- expiry are decoded (gone in common.lua decides).

local s = redis.call('GET', KEYS[1])
if s then
  local st, exp, ct, ut, att = string.match(s, '^(%d)\255([^\255]*)\255([^\255]*)\255([^\255\254]*)\255?([^\255\254]*)', 34)
  if st then
    exp = F.stored_exp(s, st, exp)
    if F.gone(st, tonumber(ct, 36) + ms(ut) + ms(exp), att) then
      return {C_EXPIRED, st .. ':' .. (F.chain_head(s) or ''), ''}
    end
    return {C_OK, '', s, ''}
  end
end
if not load() then
  return missing()
end
return reply(C_OK, '')
