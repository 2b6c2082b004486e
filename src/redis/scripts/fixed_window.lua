-- Fixed window for every limit of one plan: checks all, then commits all or none.
--
-- KEYS[i]   the counter of limit i: a hash {w = window index, c = permits granted in it, i = its
--           incarnation}. A missing key is an empty window. Windows are aligned to the Unix
--           epoch.
-- ARGV[1]   n, the permits asked for (0 reports what is available and writes nothing)
-- ARGV[2]   "acquire" or "peek" (peek: what one permit would get, writing nothing)
-- ARGV[3]   the time in microseconds, or "" for the server's TIME (the normal case)
-- ARGV[3 + 2(i-1) + 1 .. 2]  limit i: limit, window_us
--
-- Reply: {code, index, now_us, then per limit: allowed, remaining (permits), retry_after (us),
-- reset_after (us)}; code 1 = allowed (and committed), 0 = denied, -1 = KEYS[index] holds another
-- type (nothing written). Every figure is an integer of at most 2^53 (limits are at most 2^53).
-- A plan of one limit decided without reserving replies that limit's figures alone (plan.lua).

-- `expiry_slack_ms`, `n`, `peek` and `now` come from prelude.lua, run first; plan.lua, run last,
-- decides the plan, with the decision below written in at each of its `-- @decide` lines and the
-- commit at each `-- @commit` (see `src/redis/script.rs`).

-- @decide
-- Limit i's window and count, for its commit (`state`), and its figures; the read's error alone
-- (in `state`) if KEYS[i] is not a hash. Run inside `repeat ... until true`: `break` ends it.
local base = 3 + 2 * (i - 1)
local limit, window = ARGV[base + 1] + 0, ARGV[base + 2] + 0
local stored = redis.pcall('HMGET', KEYS[i], 'w', 'c')
if stored.err ~= nil then
  state = stored
  break
end
local w, c = tonumber(stored[1]), tonumber(stored[2])
-- A commit to a missing key creates it: it then names its incarnation (see the commit).
local created = not stored[1] and not stored[2]
-- The window's index, floor(now / window), corrected for the division's rounding (as div.lua's
-- `div`, written here: a function would be a closure made on every call).
local index = math.floor(now / window)
if index * window > now then
  index = index - 1
elseif (index + 1) * window <= now then
  index = index + 1
end
-- A reading in an older window than the stored one (the server's clock stepped back) counts
-- in the stored window: the count never resets early.
if w ~= nil and c ~= nil and w >= index then
  index, c = w, math.min(c, limit)
else
  c = 0
end
local until_end = (index + 1) * window - now
local take = n
if peek then
  take = 1
end
-- The request is compared with what is left, not added to the count: every figure stays
-- between 0 and the limit (at most 2^53), where doubles are exact.
local allowed, remaining, retry = 1, limit - c - take, 0
if take > limit - c then
  allowed, remaining, retry = 0, limit - c, until_end
elseif peek then
  remaining = limit - c
end
state = {index, window, c, created}
f1, f2, f3, f4 = allowed, remaining, retry, until_end

-- @commit
local index, window, c = state[1], state[2], state[3]
if state[4] then
  -- A new key names its incarnation (`i`, the server's time when it was made), so that a grant
  -- made on an earlier one is never given back to it (see give_back.lua): its count alone can
  -- repeat the earlier one's.
  local time = redis.call('TIME')
  redis.call('HSET', KEYS[i], 'w', index, 'c', c + n, 'i', time[1] .. '.' .. time[2])
else
  redis.call('HSET', KEYS[i], 'w', index, 'c', c + n)
end
-- Once the window is over the counter is indistinguishable from a missing key: expire it then.
local until_end = (index + 1) * window - now
redis.call('PEXPIRE', KEYS[i], math.floor(until_end / 1000) + expiry_slack_ms)
