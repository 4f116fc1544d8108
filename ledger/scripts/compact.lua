-- compact.lua: drop the body of a terminal record past its retention, so
-- that only its tombstone (contract.md §6: fingerprint and final state) stays for
-- the tombstone retention. Run by the compaction pass (Compactor) on every
-- key it finds; writes only when the record is due.
--
-- KEYS[1] -> a key the pass found under <prefix>:{sNN}:op:* (the record of
--            one operation, see common.lua; any other key is left alone)
-- ARGV: none
--
-- Output: 1 when the record was compacted now, 0 when it was left as it was:
-- no such key, not a string, not a record (its history included), not terminal, still in
-- its retention (exp not passed by the store's clock), or a tombstone already.
--
-- The tombstone is the record cut after its fourth field (an empty exp
-- written out as the retention, the 12th field), with an empty fifth (the
-- attempt), the consequential fields the fingerprint was taken over (cf,
-- the record's 30th field; empty for all parameters) and the head of the
-- history chain (common.lua, chain_head):
--
--   'L' <fp: 32 bytes> <st> \255 <exp> \255 <ct> \255 <ut> \255 \255 <cf> \255 <head>
--
-- which is all that any script reads of a terminal record once exp has
-- passed: load() and lookup.lua decode st, ct, ut and exp (the expiry is
-- ct + ut + exp), find it expired and answer C_EXPIRED with the final state
-- and nothing else; reserve.lua compares the fingerprint, over cf when the
-- tool's policy lists other fields now. The fields are kept verbatim (exp
-- made explicit), so the expiry reads the same; the empty attempt makes it expired whatever
-- the clock says (gone in common.lua). The value is written with the key's TTL as PTTL
-- reads it (PX; no TTL when the key has none): the key ends when it did
-- before (exp + tombstone retention), so a late replay is still refused
-- until then. Redis stores the end in milliseconds; from 7.2 on a script
-- sees one frozen clock, so the end is the same to the millisecond, and
-- before 7.2 SET reads the clock again after PTTL, which can only move the
-- end later; the embedded engine keeps TTLs below the millisecond, which
-- PTTL truncates (less than 1 ms earlier). (SET ... KEEPTTL would need
-- Redis 6.0.) Running it twice changes nothing the second time.

local s = redis.pcall('GET', KEYS[1])
if type(s) ~= 'string' or string.sub(s, 1, 1) ~= 'L' then
  return 0
end
local head = string.match(s, '^[34]\255%d*[smhd]?\255%w+\255%d*[smhd]?', 34)
if not head then
  return 0 -- not terminal (or not a record)
end
local n = 33 + #head
local att = string.sub(s, n + 2, n + 2) -- the attempt's first byte ('' or a separator: none)
if string.sub(s, n + 1, n + 1) ~= '\255' or att == '' or att == '\255' or att == '\254' then
  return 0 -- a tombstone already (or not a record)
end
local st, exp, ct, ut = string.match(head, '^(.)\255([^\255]*)\255([^\255]*)\255([^\255]*)$')
if ut ~= '' and not string.match(ut, '^%d+[smhd]?$') then
  return 0 -- a unit without a number: not a record
end
local created = tonumber(ct, 36)
if not created then
  return 0 -- a creation time no number can hold: not a record
end
local cf = ''
do
  local h = string.find(s, '\254', n + 1, true)
  local i = 4
  for f in string.gmatch(string.sub(s, n + 2, (h or (#s + 1)) - 1) .. '\255', '([^\255]*)\255') do
    i = i + 1
    if i == 30 then cf = f end
  end
end
exp = F.stored_exp(s, st, exp)
if not string.match(exp, '^%d+[smhd]?$') then
  return 0 -- no expiry: not a record
end
if created + ms(ut) + ms(exp) >= NOW then
  return 0 -- still in its retention
end
local chain = F.chain_head(s)
if not chain then
  return 0 -- a history the ledger did not write: not a record
end
local tomb = string.sub(s, 1, 33) .. st .. '\255' .. exp .. '\255' .. ct .. '\255' .. ut .. '\255\255' .. cf .. '\255' .. chain
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 then
  redis.call('SET', KEYS[1], tomb)
elseif ttl > 0 then
  redis.call('SET', KEYS[1], tomb, 'PX', tostr(ttl))
else
  return 0 -- ending now: nothing to cut
end
return 1
