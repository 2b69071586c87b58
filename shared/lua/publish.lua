-- Fenced, idempotent publish of one or more events to a run's stream (L2, B2, B3, B5).
-- KEYS[1] lease key, KEYS[2] stream key, KEYS[3] stream meta hash, KEYS[4] cancel key
-- ARGV[1] lease value "<epoch>|<owner>" the publisher believes it holds
-- ARGV[2] retained entries (maxlen), ARGV[3] trim slack, ARGV[4] TTL in seconds
-- ARGV[5] the attempt-local sequence number of the first event in this call (1-based)
-- ARGV[6..] pairs of (event name, JSON data)
-- Returns {'!fenced'} when the lease is not the publisher's, else
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
-- We trim here ourselves, in batches of `slack`, so that `t` is always known.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'!fenced'}
end
local seq_field = 's' .. string.match(ARGV[1], '^(%d+)|')
local done = tonumber(redis.call('HGET', KEYS[3], seq_field) or '0')
local seq = tonumber(ARGV[5]) - 1
local out = {redis.call('GET', KEYS[4]) or ''}
local id
for i = 6, #ARGV, 2 do
  seq = seq + 1
  if seq > done then
    local n = redis.call('HINCRBY', KEYS[3], 'n', 1)
    id = redis.call('XADD', KEYS[2], '*', 'e', ARGV[i], 'd', ARGV[i + 1], 'n', n)
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
