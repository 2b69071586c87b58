-- A run has ended: take it out of its user's active runs (max_active_runs).
-- KEYS[1] the user's admitted runs (sorted set), KEYS[2] the user's recently ended runs
-- (sorted set, member run id, score ms)
-- ARGV[1] ttl in ms of an ended-run record, ARGV[2..] run ids
-- Returns the number of runs removed from the active set.
-- Invariant: a run that ended before the web bound its slot (a fast run finishes before
-- the request that admitted it returns) is not added afterwards: limit_bind_run.lua
-- finds it here and leaves the slot free.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local removed = 0
for i = 2, #ARGV do
  removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('ZADD', KEYS[2], now, ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return removed
