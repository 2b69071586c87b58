-- Compare-and-extend the owner lease and report a pending cancel (L1, R5).
-- KEYS[1] lease key, KEYS[2] cancel key
-- ARGV[1] lease value "<epoch>|<owner>", ARGV[2] ttl in ms
-- Returns {1, cancel_action or ''} when renewed, {0, ''} when the lease is not ours.
-- Invariant: only the current holder extends the lease (compare and extend in one step).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, ''}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, redis.call('GET', KEYS[2]) or ''}
