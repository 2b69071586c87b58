-- Gap-checked replay read (B4, B5): the bound check and the range read are one atomic
-- step, so a trim in between cannot hide a gap. See publish.lua for the meta hash.
-- KEYS[1] stream key, KEYS[2] stream meta hash
-- ARGV[1] cursor id ('' = from the start of what is retained), ARGV[2] max entries
-- Returns one of
--   {'missing'}                              the stream does not exist (never or expired)
--   {'beyond', last_id}                      the cursor is after the last id issued
--   {'gap', first_id, last_id}               something after the cursor is gone
--   {'ok', n, entry, entry, ...}             entries after the cursor (XRANGE shape);
--                                            n = events published so far
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function cmp(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  if am ~= bm then return am < bm and -1 or 1 end
  if as ~= bs then return as < bs and -1 or 1 end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'missing'}
end
local m = redis.call('HMGET', KEYS[2], 'n', 'o', 'l', 't')
local n, origin, last, trimmed = m[1] or '0', m[2], m[3], m[4]
local cursor = ARGV[1]
if cursor ~= '' then
  if last and cmp(cursor, last) > 0 then
    return {'beyond', last}
  end
  if (origin and cmp(cursor, origin) < 0) or (trimmed and cmp(trimmed, cursor) > 0) then
    local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
    return {'gap', first[1] and first[1][1] or '', last or ''}
  end
end
local entries
if cursor == '' then
  entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[2])
else
  entries = redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT', ARGV[2])
end
local out = {'ok', n}
for i = 1, #entries do out[#out + 1] = entries[i] end
return out
