-- Count one finished run of a worker process (the ops view's per-worker counts).
-- KEYS[1] the process's hash (Keys.ops_worker_finished: host and pid)
-- ARGV[1] the worker id (host:pid:nonce), ARGV[2] the run's terminal status, ARGV[3] TTL (s)
-- Returns the new count of that status.
-- Invariant: the counts are of one worker incarnation: a new process that got a pid used
-- before on the host finds another worker id in the hash and starts again from zero.
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'worker', ARGV[1])
end
local n = redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return n
