-- mark_unknown.lua: the claim holder cannot tell whether the effect happened
-- (contract.md §4, MarkUnknown).
--
-- KEYS[1..5] -> record, unresolved index, lease index, stats, overdue
--               (see common.lua)
-- ARGV[1] -> principal
-- ARGV[2] -> lease index member
-- ARGV[3] -> fencing token of the attempt
-- ARGV[4] -> the caller's note ('' for none)
--
-- Output: {code, aux, record, moved} (common.lua, reply) or {code, aux, ''}:
--   {C_OK, '', record}                    UNKNOWN now (or already: the
--                                         report is still recorded), or
--                                         terminal and left as it is
--   {C_STALE, state, ''}                  the token is not the current one
--   {C_COMPLETION_CONFLICT, '', record}   this attempt already reported an
--                                         outcome (it is PENDING after a
--                                         retryable failure)
--   {C_NOT_FOUND, '', ''} / {C_EXPIRED, state, ''}
--
-- Never downgrades a terminal state. A repeat (the attempt's MARKED_UNKNOWN
-- entry in the history) succeeds again and changes nothing, also after the
-- record moved on.

local token = ARGV[3]

if not load() then
  return missing()
end
if did(token, 'MARKED_UNKNOWN') then
  -- A repeat of this call, also after the record moved on (reconciled,
  -- claimed again): it took effect, say so, and undo nothing that came
  -- after it (a reconciler's finding must not be turned back to UNKNOWN).
  return reply(C_OK, '')
end
if R.tok ~= token then
  return {C_STALE, R.st, ''}
end
if is_terminal(R.st) then
  return reply(C_OK, '')
end
if R.st == ST_UNKNOWN then
  if R.ctk ~= token then
    -- UNKNOWN already (its lease ran out first): the report still gets its
    -- entry, so that its repeat after a reconciler's finding is recognised
    -- above and does not undo the finding.
    transition(ST_UNKNOWN, 'MARKED_UNKNOWN', ARGV[4])
  end
  return reply(C_OK, '')
end
if R.ctk == token then
  return reply(C_COMPLETION_CONFLICT, '')
end
-- RUNNING, or PENDING after a not-applied finding while this attempt was
-- still out: either way nobody can tell any more.
transition(ST_UNKNOWN, 'MARKED_UNKNOWN', ARGV[4])
return reply(C_OK, '')
