-- Take the best waiting run for a free worker slot (shared/runs/run_queue.py).
-- KEYS[1] the run queue (sorted set: member run id, score priority * 1e13 + ms queued)
-- ARGV[1] take only priorities below this one (a number; 10 for any)
-- ARGV[2] and at least this one (a number; 0 for any)
-- Returns {run id, score} of the run taken, or false when none of those waits.
-- Invariant: each queued run is taken once; the lowest score first (priority, then age).
local got = redis.call('ZRANGEBYSCORE', KEYS[1], tonumber(ARGV[2]) * 1e13,
  '(' .. (tonumber(ARGV[1]) * 1e13), 'WITHSCORES', 'LIMIT', 0, 1)
if not got[1] then return false end
redis.call('ZREM', KEYS[1], got[1])
return {got[1], got[2]}
