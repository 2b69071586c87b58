-- Delete the lease only if it is still ours.
-- KEYS[1] lease key; ARGV[1] lease value. Returns 1 if deleted.
-- KEYS[2..] (optional) other keys of the run, deleted in any case (an ended run's cancel
-- request: one round trip at the end of a run instead of two).
-- Invariant: an owner only ever deletes its own lease, never a newer owner's.
for i = 2, #KEYS do
  redis.call('DEL', KEYS[i])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
