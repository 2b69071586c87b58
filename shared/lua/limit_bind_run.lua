-- Turn a reservation into the admitted run it made room for (max_active_runs).
-- KEYS[1] the user's admitted runs, KEYS[2] the user's reservations, KEYS[3] the user's
-- recently ended runs (limit_release_run.lua)
-- ARGV[1] token, ARGV[2] run id, ARGV[3] key ttl in ms (a day: the set outlives its runs)
-- Returns 1 when the run now holds the slot, 0 when it had already ended (slot freed).
-- Invariant: the slot moves from reservation to run in one step, so a concurrent
-- reserve never sees it free in between; a run that ended first never takes a slot.
local t = redis.call('TIME')
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('ZSCORE', KEYS[3], ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], tonumber(t[1]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
