-- Token bucket (exact GCRA) for every limit of one plan: checks all, then commits all or none.
--
-- KEYS[i]   the bucket of limit i: a hash {t = TAT in whole microseconds, f = the TAT's remainder
--           in ticks, 0 <= f < tpu}. A missing key is a full bucket.
-- ARGV[1]   n, the permits asked for (0 reports what is available and writes nothing)
-- ARGV[2]   "acquire" or "peek" (peek: what one permit would get, writing nothing)
-- ARGV[3]   the time in microseconds, or "" for the server's TIME (the normal case)
-- ARGV[3 + 3(i-1) + 1 .. 3]  limit i: tpu (ticks per microsecond), token (ticks per permit),
--           burst (ticks of a full bucket = limit * token = tpu * window_us)
--
-- Every figure is an integer below 2^53 (the caller checks 2 * burst <= 2^52), so Lua's doubles
-- hold them exactly. Reply: {code, index, now_us, then per limit: allowed, remaining (ticks),
-- retry_after (ticks), reset_after (ticks)}; code 1 = allowed (and committed), 0 = denied,
-- -1 = KEYS[index] holds another type (nothing written).

-- `int`, `expire_after`, `n`, `peek`, `now` and `decide_plan` come from prelude.lua, run first.

-- The debt (ticks still to refill) of bucket i at `now`; a TAT behind `now` is a full bucket.
local function debt_of(i, tpu, burst)
  local stored = redis.call('HMGET', KEYS[i], 't', 'f')
  local t, f = tonumber(stored[1]), tonumber(stored[2])
  if t == nil or f == nil or t < now then
    return 0
  end
  -- A TAT more than two windows ahead can only come from a clock that stepped back; cap the
  -- debt there (it denies either way) so the product below stays exact.
  if t - now > 2 * (burst / tpu) then
    return 2 * burst
  end
  return (t - now) * tpu + f
end

-- The answer of limit i to `take` permits: allowed, remaining, retry_after, reset_after, new debt.
local function decide(debt, take, token, burst)
  local new_debt = debt + take * token
  if new_debt <= burst then
    return 1, burst - new_debt, 0, new_debt, new_debt
  end
  return 0, math.max(burst - debt, 0), new_debt - burst, debt, nil
end

-- Limit i's new debt (nil unless it takes permits), for its commit, and its figures.
local function decide_limit(i)
  local base = 3 + 3 * (i - 1)
  local tpu, token, burst = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  local debt = debt_of(i, tpu, burst)
  local allowed, remaining, retry, reset, new_debt
  if peek then
    allowed, remaining, retry, reset = decide(debt, 1, token, burst)
    if allowed == 1 then
      allowed, remaining, retry, reset = decide(debt, 0, token, burst)
    end
  elseif n == 0 then
    -- Takes nothing, so it is granted whatever the debt.
    allowed, remaining, retry, reset = 1, math.max(burst - debt, 0), 0, debt
  else
    allowed, remaining, retry, reset, new_debt = decide(debt, n, token, burst)
  end
  return new_debt, allowed, remaining, retry, reset
end

-- All granted: commit bucket i. new TAT = now + new_debt ticks, split into whole microseconds
-- and a remainder; the quotient is corrected so that no rounding of the division can leave the
-- remainder outside [0, tpu).
local function commit_limit(i, new_debt)
  local tpu = tonumber(ARGV[3 + 3 * (i - 1) + 1])
  local q = math.floor(new_debt / tpu)
  local r = new_debt - q * tpu
  if r < 0 then
    q, r = q - 1, r + tpu
  elseif r >= tpu then
    q, r = q + 1, r - tpu
  end
  redis.call('HSET', KEYS[i], 't', int(now + q), 'f', int(r))
  -- The bucket is full again, indistinguishable from a missing key, q (+1 if r > 0)
  -- microseconds from now: expire it then.
  expire_after(KEYS[i], q)
end

return decide_plan('hash', decide_limit, commit_limit)
