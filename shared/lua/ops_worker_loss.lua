-- Record a lost worker once (the ops view's worker-loss events): whoever sees the loss first
-- (a web process whose broadcast the worker no longer answers, or the reaper finding its
-- leases expired) writes the event; every later caller only adds the runs it saw (and the
-- worker's name, when the first did not know it).
-- KEYS[1] sorted set: lost worker id -> when first seen (unix s)
-- KEYS[2] hash: lost worker id -> its event (JSON object with a `runs` array)
-- ARGV[1] the lost worker's id, ARGV[2] now (unix s), ARGV[3] the event (JSON, `runs` a
-- non-empty array of run ids), ARGV[4] retention (s), ARGV[5] most events kept
-- Returns 1 when this call recorded the loss, 0 when it was recorded before (runs merged).
-- Invariant: one event per worker id however many processes call at once: ZADD NX decides
-- who is first and the merge of runs is in the same step, so no run seen by a caller is lost
-- and none is listed twice. Events older than the retention, and beyond the most kept
-- (oldest first), are removed with their entries.
local worker, now, retention, most = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local first = redis.call('ZADD', KEYS[1], 'NX', now, worker)
local event = cjson.decode(ARGV[3])
if first == 0 then
  local old = redis.call('HGET', KEYS[2], worker)
  if old then
    local kept = cjson.decode(old)
    local seen = {}
    local runs = {}
    for _, r in ipairs(kept['runs'] or {}) do
      if not seen[r] then seen[r] = true; table.insert(runs, r) end
    end
    for _, r in ipairs(event['runs'] or {}) do
      if not seen[r] then seen[r] = true; table.insert(runs, r) end
    end
    kept['runs'] = runs
    if (kept['name'] == nil or kept['name'] == cjson.null) and event['name'] ~= cjson.null then
      kept['name'] = event['name']  -- a later caller that knows the worker's name
    end
    event = kept
  end
end
redis.call('HSET', KEYS[2], worker, cjson.encode(event))
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - retention))
local extra = redis.call('ZCARD', KEYS[1]) - #gone - most
if extra > 0 then
  local oldest = redis.call('ZRANGE', KEYS[1], #gone, #gone + extra - 1)
  for _, w in ipairs(oldest) do table.insert(gone, w) end
end
for _, w in ipairs(gone) do
  redis.call('ZREM', KEYS[1], w)
  redis.call('HDEL', KEYS[2], w)
end
local ttl = math.ceil(retention)
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return first
