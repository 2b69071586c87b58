-- Admit one memory update to its debounce bucket, or skip it under backpressure (M4, M5).
-- KEYS[1] due, KEYS[2] updates:<bucket>, KEYS[3] leases, KEYS[4] stats, KEYS[5] urgent,
-- KEYS[6] first
-- ARGV[1] bucket, ARGV[2] update JSON, ARGV[3] now + debounce, ARGV[4] backlog limit,
-- ARGV[5] priority (0|1), ARGV[6] urgent (0|1), ARGV[7] now, ARGV[8] max wait
-- Returns 0 skipped, 1 admitted (new pending bucket), 2 merged into a pending bucket.
-- Invariant: a bucket's due time is the latest admission + debounce but never past its
-- first admission + max wait; an urgent bucket is due now and never pushed back by a
-- later ordinary admission; only an ordinary update is ever skipped.
local pending = redis.call('ZSCORE', KEYS[1], ARGV[1])
if ARGV[5] == '0' then
  local backlog = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[3])
  if backlog >= tonumber(ARGV[4]) then
    redis.call('HINCRBY', KEYS[4], 'skipped', 1)
    return 0
  end
end
redis.call('RPUSH', KEYS[2], ARGV[2])
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[5], ARGV[1], '1')
  redis.call('ZADD', KEYS[1], ARGV[7], ARGV[1])
elseif redis.call('HEXISTS', KEYS[5], ARGV[1]) == 0 then
  local first = redis.call('HGET', KEYS[6], ARGV[1])
  if not first then
    redis.call('HSET', KEYS[6], ARGV[1], ARGV[7])
    first = ARGV[7]
  end
  local due = math.min(tonumber(ARGV[3]), tonumber(first) + tonumber(ARGV[8]))
  redis.call('ZADD', KEYS[1], due, ARGV[1])
end
if pending then
  redis.call('HINCRBY', KEYS[4], 'merged', 1)
  return 2
end
redis.call('HINCRBY', KEYS[4], 'admitted', 1)
return 1
