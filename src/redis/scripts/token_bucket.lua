-- Token bucket (exact GCRA) for every limit of one plan: checks all, then commits all or none.
--
-- KEYS[i]   the bucket of limit i: a string, the TAT in whole microseconds, then `:` and the
--           TAT's remainder in ticks (0 < f < tpu) if it has one (never when a tick is a
--           microsecond). A missing key is a full bucket.
-- ARGV[1]   n, the permits asked for (0 reports what is available and writes nothing)
-- ARGV[2]   "acquire" or "peek" (peek: what one permit would get, writing nothing)
-- ARGV[3]   the time in microseconds, or "" for the server's TIME (the normal case)
-- ARGV[3 + 3(i-1) + 1 .. 3]  limit i: tpu (ticks per microsecond), token (ticks per permit),
--           burst (ticks of a full bucket = limit * token = tpu * window_us)
--
-- Every figure is an integer below 2^53 (the caller checks 2 * burst <= 2^52), so Lua's doubles
-- hold them exactly. Reply: {code, index, now_us, then per limit: allowed, remaining (ticks),
-- retry_after (ticks), reset_after (ticks)}; code 1 = allowed (and committed), 0 = denied,
-- -1 = KEYS[index] holds another type, or a string that is no bucket (nothing written).
-- A plan of one limit decided without reserving replies that limit's figures alone (plan.lua).

-- `expiry_slack_ms`, `n`, `peek` and `now` come from prelude.lua, run first; plan.lua, run last,
-- decides the plan, with the decision below written in at each of its `-- @decide` lines and the
-- commit at each `-- @commit` (see `src/redis/script.rs`).

-- @decide
-- Limit i's commit (`state`: the new TAT's whole microseconds after now, with its remainder in
-- ticks if not 0; nil unless it takes permits) and its figures; the read's error alone if
-- KEYS[i] is not a string. Run inside `repeat ... until true`: `break` ends it.
local stored = redis.pcall('GET', KEYS[i])
if type(stored) == 'table' then
  -- An error: a GET's replies are strings, or false for a missing key.
  state = stored
  break
end
local base = 3 + 3 * (i - 1)
local tpu, token, burst = ARGV[base + 1] + 0, ARGV[base + 2] + 0, ARGV[base + 3] + 0
-- The debt (ticks still to refill) at `now`; a TAT behind `now` (or a missing key, false) is a
-- full bucket. A TAT without a remainder is read with one conversion.
-- A string that is no bucket is another program's key, as a key of another type is: a TAT is a
-- whole number of microseconds below 2^53 and a remainder a whole number of ticks below tpu
-- (nan, infinities and fractions fail these tests). A whole number in another notation (an
-- exponent, hex, spaces) is read as the number it names: telling those apart would take a
-- pattern match, about 2,000 server instructions on every decision.
local debt = 0
local t, f = tonumber(stored), 0
if t == nil and stored then
  local colon = string.find(stored, ':', 1, true)
  if colon ~= nil then
    t, f = tonumber(string.sub(stored, 1, colon - 1)), tonumber(string.sub(stored, colon + 1))
  end
  if t == nil or f == nil or f % 1 ~= 0 or f < 0 or f >= tpu then
    state = {err = 'WRONGTYPE not a bucket'}
    break
  end
end
if t ~= nil and not (t % 1 == 0 and t >= 0 and t < 9007199254740992) then
  state = {err = 'WRONGTYPE not a bucket'}
  break
end
if t ~= nil and t >= now then
  -- A TAT more than two windows ahead can only come from a clock that stepped back; cap the
  -- debt there (it denies either way) so the product below stays exact.
  if t - now > 2 * (burst / tpu) then
    debt = 2 * burst
  else
    debt = (t - now) * tpu + f
  end
end
-- The figures: allowed, remaining, retry_after and reset_after, in ticks. A peek asks what one
-- permit would get (the quota if it fits, else its denial), n = 0 what is available (granted
-- whatever the debt, since it takes nothing).
local take = n
if peek then
  take = 1
elseif n == 0 then
  f1, f2, f3, f4 = 1, math.max(burst - debt, 0), 0, debt
  break
end
local new_debt = debt + take * token
if new_debt > burst then
  f1, f2, f3, f4 = 0, math.max(burst - debt, 0), new_debt - burst, debt
  break
elseif peek then
  f1, f2, f3, f4 = 1, burst - debt, 0, debt
  break
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
f1, f2, f3, f4 = 1, burst - new_debt, 0, new_debt
if r == 0 then
  -- The usual commit (always, when a tick is a microsecond): a number, no table.
  state = q
else
  state = {q, r}
end

-- @commit
-- All granted: commit bucket i, written with its expiry in one command. The bucket is full
-- again, indistinguishable from a missing key, q (+1 if r > 0) microseconds from now: it
-- expires then. A TAT with no remainder goes as a number, which Redis writes exactly; one with
-- a remainder as the digits of both.
if type(state) == 'number' then
  redis.call('SET', KEYS[i], now + state, 'PX', math.floor(state / 1000) + expiry_slack_ms)
else
  local value = string.format('%.0f:%.0f', now + state[1], state[2])
  redis.call('SET', KEYS[i], value, 'PX', math.floor(state[1] / 1000) + expiry_slack_ms)
end
