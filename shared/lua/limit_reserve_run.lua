-- Reserve an active-run slot for an admission in flight (max_active_runs).
-- KEYS[1] the user's admitted runs (sorted set, member run id)
-- KEYS[2] the user's reservations of admissions in flight (member token, score ms)
-- ARGV[1] limit, ARGV[2] token, ARGV[3] reservation and key ttl in ms
-- Returns {1, n} when reserved (n: the runs and reservations the user held before), else
-- {0, run ids...} for the caller to prune ended runs.
-- Invariant: runs + live reservations never exceed the limit; a reservation whose
-- process died mid-admission expires after the ttl and is dropped here first.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
local n = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
if n >= tonumber(ARGV[1]) then
  local out = {0}
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do table.insert(out, m) end
  return out
end
redis.call('ZADD', KEYS[2], now, ARGV[2])
redis.call('PEXPIRE', KEYS[2], ttl)
return {1, n}
