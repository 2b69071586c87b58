-- Queue a run for the next free worker slot (shared/runs/run_queue.py).
-- KEYS[1] the run queue (sorted set: member run id, score priority * 1e13 + ms queued)
-- ARGV[1] priority (0 taken first), ARGV[2] run id
-- Returns {1 when queued now, 0 when it was queued already; the priority it is queued at}.
-- Invariant: one entry per run; a run already queued keeps its place and its class (NX):
-- a re-dispatch neither sends a waiting run to the back nor moves a cron firing into the
-- share of slots kept for callers' runs. The clock is the server's, one for every process.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local added = redis.call('ZADD', KEYS[1], 'NX', tonumber(ARGV[1]) * 1e13 + now, ARGV[2])
if added == 1 then return {1, tonumber(ARGV[1])} end
local score = redis.call('ZSCORE', KEYS[1], ARGV[2])
return {0, math.floor(tonumber(score) / 1e13)}
