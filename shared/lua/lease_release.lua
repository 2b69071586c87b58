-- Delete the lease only if it is still ours.
-- KEYS[1] lease key; ARGV[1] lease value. Returns 1 if deleted.
-- Invariant: an owner only ever deletes its own lease, never a newer owner's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
