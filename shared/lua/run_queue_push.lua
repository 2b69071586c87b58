-- Queue a run for the next free worker slot (shared/runs/run_queue.py).
-- KEYS[1] the run queue (sorted set: member run id, score priority * 1e13 + ms queued)
-- ARGV[1] priority (0 taken first), ARGV[2] run id
-- Returns 1.
-- Invariant: one entry per run; a run already queued keeps its place unless this
-- priority is higher (ZADD LT): a re-dispatch never sends a waiting run to the back, and
-- may move a starved one up. The clock is the server's, the same for every process.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], 'LT', tonumber(ARGV[1]) * 1e13 + now, ARGV[2])
return 1
