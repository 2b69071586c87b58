-- Free a webhook attempt's slot of one share and hand it to the delivery parked there
-- longest (shared/webhooks/fairness.py).
-- KEYS[1] the share's slots, KEYS[2] the share's parked deliveries
-- ARGV[1] the attempt's token, ARGV[2] limit, ARGV[3] slot ttl ms
-- Returns the run id the slot was handed to (the caller sends it again), or false.
-- Invariant: freeing and handing over are one step, so no parked delivery waits behind
-- a free slot; a handed slot ('w:'..run id) counts like any other until taken or expired.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return false end
local woken = redis.call('ZPOPMIN', KEYS[2])
if not woken[1] then return false end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), 'w:' .. woken[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return woken[1]
