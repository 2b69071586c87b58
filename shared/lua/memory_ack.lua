-- Remove a processed memory batch (M4).
-- KEYS[1] leases, KEYS[2] claims, KEYS[3] batch:<token>, KEYS[4] stats
-- ARGV[1] token
-- Returns 1 if this call acked the batch, 0 if it was already gone.
-- Invariant: `extracted` counts each batch once, however many attempts ack it.
local had = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
if had == 1 then redis.call('HINCRBY', KEYS[4], 'extracted', 1) end
return had
