-- Lease a due memory bucket as the batch <token> (M4).
-- KEYS[1] due, KEYS[2] updates:<bucket>, KEYS[3] batch:<token>, KEYS[4] leases,
-- KEYS[5] claims, KEYS[6] urgent, KEYS[7] first
-- ARGV[1] bucket, ARGV[2] token, ARGV[3] now, ARGV[4] lease deadline
-- Returns 1 when the bucket was due and is now the leased batch <token>, else 0.
-- Invariant: an admitted update is always in exactly one place, its bucket's list or one
-- leased batch (the list is renamed, never copied), so a claim loses or doubles nothing.
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) > tonumber(ARGV[3]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('RENAME', KEYS[2], KEYS[3])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[2])
redis.call('HSET', KEYS[5], ARGV[2], '0')
return 1
