-- Extend a live connection's slot (max_connections_per_user).
-- KEYS[1] the user's connections (sorted set, member connection id, score expiry ms)
-- ARGV[1] connection id, ARGV[2] ttl in ms
-- Returns 1.
-- Invariant: only an existing member is extended (ZADD XX): a slot already released or
-- expired is never brought back past the limit.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
