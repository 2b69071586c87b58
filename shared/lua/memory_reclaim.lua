-- Re-lease a memory batch whose lease ran out (the worker died or is stuck) (M4).
-- KEYS[1] leases, KEYS[2] claims, KEYS[3] batch:<token>, KEYS[4] stats
-- ARGV[1] token, ARGV[2] now, ARGV[3] new deadline, ARGV[4] max attempts
-- Returns the attempt number when the expired lease was renewed, 0 when the lease is
-- not expired (or gone), -1 when the batch was dropped after max attempts.
-- Invariant: a batch is re-sent only once its lease expired, and dropped (and counted)
-- after max attempts, so a poison batch cannot loop forever.
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) > tonumber(ARGV[2]) then return 0 end
local n = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
if n >= tonumber(ARGV[4]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('DEL', KEYS[3])
  redis.call('HINCRBY', KEYS[4], 'dropped', 1)
  return -1
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return n
