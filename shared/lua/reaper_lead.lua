-- Take or keep the reaper's leader lock (one active reaper, any worker takes over) (R4, L4).
-- KEYS[1] leader key
-- ARGV[1] the worker id, ARGV[2] lock ttl in ms
-- Returns 1 when the worker leads (the lock was free and is now its, or was its and is
-- extended), 0 when another worker holds it.
-- Invariant: only the current holder extends the lock. Check and extend are one step, so
-- a worker whose lock expired and was taken over can never extend the new holder's lock
-- (the race of SET NX, then GET, then PEXPIRE as three commands).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
