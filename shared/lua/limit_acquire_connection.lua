-- Take an open-connection slot of a user (max_connections_per_user).
-- KEYS[1] the user's connections (sorted set, member connection id, score expiry ms)
-- ARGV[1] limit, ARGV[2] connection id, ARGV[3] ttl in ms
-- Returns 1 when acquired, 0 when the user is at the limit.
-- Invariant: live connections never exceed the limit; a member whose process died
-- without releasing it expires after the ttl and is dropped here first.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
