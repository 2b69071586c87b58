-- Per-user run rate (runs_per_minute) as GCRA, the generic cell rate algorithm.
-- KEYS[1] the user's rate key: the theoretical arrival time (TAT) in ms
-- ARGV[1] emission interval ms (window / limit), ARGV[2] burst tolerance ms
--   (interval * (limit - 1)), ARGV[3] (optional, default 1) how many runs the request
--   creates (a batch): all of them conform or none is counted
-- Returns {1, 0} when allowed, {0, ms until the next allowed request} when refused.
-- Invariant: at most `limit` runs in any window, counted on the Redis clock so that
-- every web process agrees; a refused request does not move the TAT.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3] or 1)
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local last = tat + interval * (cost - 1)  -- the TAT the last of the `cost` runs sees
if now < last - burst then return {0, last - burst - now} end
local new_tat = last + interval
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil(new_tat - now) + 1)
return {1, 0}
