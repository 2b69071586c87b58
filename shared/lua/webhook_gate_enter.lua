-- Take a webhook attempt's slot under one share (a receiver host's or an owner's), or park
-- the delivery until a slot of that share is handed to it (shared/webhooks/fairness.py).
-- KEYS[1] the share's slots (sorted set: member token or 'w:'..run id, score expiry ms)
-- KEYS[2] the share's parked deliveries (sorted set: member run id, score ms parked)
-- ARGV[1] limit, ARGV[2] token, ARGV[3] slot ttl ms, ARGV[4] run id, ARGV[5] parked ttl ms
-- Returns {1} when the slot is taken; {0} when parked; {0, run id} when parked and a free
-- slot was handed to that run, parked longer (the caller sends it again).
-- Invariant: slots never exceed the limit (an expired one is dropped first); parked
-- deliveries get free slots oldest first, before any newcomer; a slot handed to a run
-- ('w:'..run id) is taken by that run only, or expires.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local run = ARGV[4]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local function take()
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('ZREM', KEYS[2], run)
  return {1}
end
if redis.call('ZREM', KEYS[1], 'w:' .. run) == 1 then return take() end
local free = redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1])
local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if free and (not head or head == run) then return take() end
redis.call('ZADD', KEYS[2], 'NX', now, run)
redis.call('PEXPIRE', KEYS[2], ARGV[5])
if free then
  redis.call('ZREM', KEYS[2], head)
  redis.call('ZADD', KEYS[1], now + ttl, 'w:' .. head)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {0, head}
end
return {0}
