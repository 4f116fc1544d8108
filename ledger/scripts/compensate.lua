-- compensate.lua: link a compensation to the operation it compensates, on
-- that operation's record (contract.md §4, Reserve with compensates), or
-- take back a link this call's Reserve made when the compensation was then
-- refused. The compensation's own record names its target (reserve.lua).
--
-- KEYS[1..5] -> the compensated operation's keys (see common.lua)
-- ARGV[1]  -> principal
-- ARGV[2]  -> the compensated operation's lease index member
-- ARGV[3]  -> the compensation's operation id (raw)
-- ARGV[4]  -> '+' to link, '-' to unlink
--
-- Output: {code, aux, record}:
--   {C_OK, '1', record}               linked (unlinked) by this call
--   {C_OK, '0', record}               it was linked (not linked) already
--   {C_NOT_COMPENSABLE, 'state', record}  to link: not SUCCEEDED
--   {C_NOT_COMPENSABLE, 'limit', record}  to link: it has 16 already
--   {C_NOT_FOUND, '', ''}, {C_EXPIRED, state, ''}  no record to link to
--
-- The link changes no state, time or history of the compensated record.

local id, add = ARGV[3], ARGV[4] == '+'
if not load() then
  return missing()
end
local list = R.cby or ''
local wrapped = '\252' .. list .. '\252'
local at = string.find(wrapped, '\252' .. id .. '\252', 1, true)
if add then
  if list ~= '' and at then
    return reply(C_OK, '0')
  end
  if R.st ~= ST_SUCCEEDED then
    return reply(C_NOT_COMPENSABLE, 'state')
  end
  local _, seps = string.gsub(list, '\252', '')
  if list ~= '' and seps + 1 >= 16 then
    return reply(C_NOT_COMPENSABLE, 'limit')
  end
  if list == '' then R.cby = id else R.cby = list .. '\252' .. id end
  flush()
  return reply(C_OK, '1')
end
if list == '' or not at then
  return reply(C_OK, '0')
end
local rest = string.sub(wrapped, 1, at) .. string.sub(wrapped, at + #id + 2)
rest = string.sub(rest, 2, -2)
if rest == '' then R.cby = nil else R.cby = rest end
flush()
return reply(C_OK, '1')
