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

-- `int`, `expire_after`, `read_own`, `n`, `peek`, `now` and `decide_plan` come from prelude.lua,
-- run first.

-- The answer of a bucket in `debt` to `take` permits: allowed, remaining, retry_after,
-- reset_after, and the new debt if allowed.
local function decide(debt, take, token, burst)
  local new_debt = debt + take * token
  if new_debt <= burst then
    return 1, burst - new_debt, 0, new_debt, new_debt
  end
  return 0, math.max(burst - debt, 0), new_debt - burst, debt, nil
end

-- Limit i's commit (the new TAT's microseconds and ticks; nil unless it takes permits) and its
-- figures; nothing if KEYS[i] is not a hash.
local function decide_limit(i)
  local stored = read_own('HMGET', KEYS[i], 't', 'f')
  if not stored then
    return nil
  end
  local base = 3 + 3 * (i - 1)
  local tpu, token, burst = ARGV[base + 1] + 0, ARGV[base + 2] + 0, ARGV[base + 3] + 0
  -- The debt (ticks still to refill) at `now`; a TAT behind `now` is a full bucket. A remainder
  -- of "0" (always, when a tick is a microsecond) is read without a conversion.
  local debt = 0
  local t, f = tonumber(stored[1]), stored[2]
  if f == '0' then
    f = 0
  else
    f = tonumber(f)
  end
  if t ~= nil and f ~= nil and t >= now then
    -- A TAT more than two windows ahead can only come from a clock that stepped back; cap the
    -- debt there (it denies either way) so the product below stays exact.
    if t - now > 2 * (burst / tpu) then
      debt = 2 * burst
    else
      debt = (t - now) * tpu + f
    end
  end
  local allowed, remaining, retry, reset, new_debt
  if peek then
    allowed, remaining, retry, reset = decide(debt, 1, token, burst)
    if allowed == 1 then
      allowed, remaining, retry, reset = decide(debt, 0, token, burst)
    end
    return nil, allowed, remaining, retry, reset
  elseif n == 0 then
    -- Takes nothing, so it is granted whatever the debt.
    return nil, 1, math.max(burst - debt, 0), 0, debt
  end
  allowed, remaining, retry, reset, new_debt = decide(debt, n, token, burst)
  if new_debt == nil then
    return nil, allowed, remaining, retry, reset
  end
  -- new TAT = now + new_debt ticks, split into whole microseconds and a remainder; the quotient
  -- is corrected so that no rounding of the division can leave the remainder outside [0, tpu).
  local q = math.floor(new_debt / tpu)
  local r = new_debt - q * tpu
  if r < 0 then
    q, r = q - 1, r + tpu
  elseif r >= tpu then
    q, r = q + 1, r - tpu
  end
  return {q, r}, allowed, remaining, retry, reset
end

-- All granted: commit bucket i.
local function commit_limit(i, split)
  local q, r = split[1], split[2]
  local r_digits = '0'
  if r ~= 0 then
    r_digits = int(r)
  end
  redis.call('HSET', KEYS[i], 't', int(now + q), 'f', r_digits)
  -- The bucket is full again, indistinguishable from a missing key, q (+1 if r > 0)
  -- microseconds from now: expire it then.
  expire_after(KEYS[i], q)
end

return decide_plan(decide_limit, commit_limit)
