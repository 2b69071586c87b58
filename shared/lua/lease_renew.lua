-- Compare-and-extend the owner lease and report a pending cancel (L1, R5), and how far the
-- run's stream has this attempt's events (B5 tail check after a failover).
-- KEYS[1] lease key, KEYS[2] cancel key, KEYS[3] (optional) the stream's meta hash
-- ARGV[1] lease value "<epoch>|<owner>", ARGV[2] ttl in ms
-- Returns {1, cancel_action or '', s} when renewed, where s is the attempt's newest event
-- sequence number the stream has (meta field s<epoch>, -1 without KEYS[3]), {0, '', -1}
-- when the lease is not ours.
-- Invariant: only the current holder extends the lease (compare and extend in one step).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, '', -1}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local seq = -1
if KEYS[3] then
  seq = tonumber(redis.call('HGET', KEYS[3], 's' .. string.match(ARGV[1], '^(%d+)|')) or '0')
end
return {1, redis.call('GET', KEYS[2]) or '', seq}
