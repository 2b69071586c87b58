-- Fenced, idempotent publish of one or more events to a run's stream (L2, B2, B3, B5).
-- KEYS[1] lease key, KEYS[2] stream key, KEYS[3] stream meta hash, KEYS[4] cancel key
-- ARGV[1] lease value "<epoch>|<owner>" the publisher believes it holds
-- ARGV[2] retained entries (maxlen), ARGV[3] trim slack, ARGV[4] TTL in seconds
-- ARGV[5] the attempt-local sequence number of the first event in this call (1-based)
-- ARGV[6] k: compression dictionaries to store, ARGV[7] m: dictionaries to check
-- ARGV[8] '' for a plain call; for a repair call, the last id the publisher was answered
--   (see "Tail repair" below)
-- ARGV[9..] k pairs of (dictionary id, bytes), then m dictionary ids, then pairs of
--   (event name, data in the stream encoding of shared/bridge/codec.py)
-- Returns {'!fenced'} when the lease is not the publisher's, {'!dict'} when a dictionary
-- the events use is not stored (Redis lost it: the publisher resends it), {'!tail', s}
-- when the stream lost this attempt's entries after its sequence number s, else
-- {cancel_action or '', id1, id2, ...} with the ids of the events added by this call.
-- Invariant: only the lease holder appends, and each event at most once (below).
--
-- Idempotence: meta field s<epoch> holds the highest sequence number already added by
-- that attempt, so a retried call (the reply was lost with the connection) skips what
-- the first try already appended: no duplicate event ever reaches a subscriber.
--
-- The meta hash also makes gap detection exact (Redis 7.0 does not record trimmed ids):
--   n  events ever published to this incarnation of the stream (entry field n too,
--      so a follower can prove contiguity)
--   o  the first id of this incarnation (a cursor below it predates a Redis loss)
--   l  the last id issued
--   t  the newest id trimmed away (every id <= t is gone, every id > t is kept)
--   z<id>  a compression dictionary of the run's entries (immutable; written before the
--      first entry that uses it, expires with the stream)
--   h  lost ranges: "lo hi " pairs; ids in (lo, hi] were issued and are gone (below)
-- We trim here ourselves, in batches of `slack`, so that `t` is always known.
--
-- Tail repair: replication is asynchronous, so a replica promoted by a failover may lack
-- the last entries the publisher was answered for (and its meta hash is as old). A plain
-- call whose first sequence number is past s<epoch> + 1 finds that out and adds nothing:
-- it answers {'!tail', s}. The publisher then sends a repair call (ARGV[8] = the last id
-- it was answered) starting at s + 1: the events it still holds, behind a `lost` marker
-- entry for those it no longer holds. The repair records (l, ARGV[8]] as a lost range and
-- makes every new id greater than ARGV[8], so a cursor that saw a lost entry is a gap
-- (never a hole, never a duplicate of a republished event) and ids keep increasing (B2).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'!fenced'}
end
local stores = tonumber(ARGV[6])
local checks = tonumber(ARGV[7])
local first = 9 + 2 * stores + checks
local seq_field = 's' .. string.match(ARGV[1], '^(%d+)|')
local done = tonumber(redis.call('HGET', KEYS[3], seq_field) or '0')
local seq = tonumber(ARGV[5]) - 1
local repair = ARGV[8]
if repair == '' and seq > done then
  return {'!tail', done}
end
for i = 9 + 2 * stores, first - 1 do
  if redis.call('HEXISTS', KEYS[3], 'z' .. ARGV[i]) == 0 then
    return {'!dict'}
  end
end
for i = 9, 8 + 2 * stores, 2 do
  redis.call('HSET', KEYS[3], 'z' .. ARGV[i], ARGV[i + 1])
end
local next_id = '*'
if repair ~= '' then
  local function key(x)
    local ms, sq = string.match(x, '^(%d+)-(%d+)$')
    return tonumber(ms), tonumber(sq)
  end
  local last = redis.call('HGET', KEYS[3], 'l') or '0-0'
  local lms, lsq = key(last)
  local rms, rsq = key(repair)
  if rms > lms or (rms == lms and rsq > lsq) then
    redis.call('HSET', KEYS[3], 'h', (redis.call('HGET', KEYS[3], 'h') or '') .. last .. ' ' .. repair .. ' ')
    if redis.call('EXISTS', KEYS[2]) == 1 then
      redis.pcall('XSETID', KEYS[2], repair)
    else
      next_id = rms .. '-' .. (rsq + 1)
    end
  end
end
local out = {redis.call('GET', KEYS[4]) or ''}
local id
for i = first, #ARGV, 2 do
  seq = seq + 1
  if seq > done then
    local n = redis.call('HINCRBY', KEYS[3], 'n', 1)
    id = redis.call('XADD', KEYS[2], next_id, 'e', ARGV[i], 'd', ARGV[i + 1], 'n', n)
    next_id = '*'
    if n == 1 then
      redis.call('HSET', KEYS[3], 'o', id)
    end
    out[#out + 1] = id
  end
end
if id then
  redis.call('HSET', KEYS[3], 'l', id, seq_field, seq)
end
local maxlen = tonumber(ARGV[2])
local len = redis.call('XLEN', KEYS[2])
if len > maxlen + tonumber(ARGV[3]) then
  local old = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', len - maxlen)
  redis.call('HSET', KEYS[3], 't', old[#old][1])
  redis.call('XTRIM', KEYS[2], 'MAXLEN', maxlen)
end
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('EXPIRE', KEYS[3], ARGV[4])
return out
