-- Take the owner lease for a run unless a newer epoch already holds it (L1).
-- KEYS[1] lease key
-- ARGV[1] lease value "<epoch>|<owner>", ARGV[2] epoch, ARGV[3] ttl in ms
-- Returns 1 when the lease is ours, 0 when a higher epoch holds it.
-- Invariant: the lease never goes back to a lower epoch, so a stale owner cannot retake it.
local cur = redis.call('GET', KEYS[1])
if cur then
  local held = tonumber(string.match(cur, '^(%d+)|'))
  if held and held > tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
