-- Sliding window counter for every limit of one plan: checks all, then commits all or none.
--
-- KEYS[i]   the counter of limit i: a hash {w = window index, c = permits granted in it, p =
--           permits granted in the window before, i = its incarnation}. A missing key is an empty counter. Windows
--           are aligned to the Unix epoch: window k is [k * window_us, (k + 1) * window_us).
-- ARGV[1]   n, from 0 to the smallest limit (0 reports what is available and writes nothing)
-- ARGV[2]   "acquire" or "peek" (peek: what one permit would get, writing nothing)
-- ARGV[3]   the time in microseconds, or "" for the server's TIME (the normal case)
-- ARGV[3 + 2(i-1) + 1 .. 2]  limit i: limit, window_us
--
-- At e microseconds into window k, with C permits granted in window k and P in window k-1, the
-- estimate is ceil(P * (W - e) / W) + C, and n permits are granted iff estimate + n <= limit. A
-- reading in an older window than the stored one (the server's clock stepped back) is counted
-- at the start of the stored window, where the previous window weighs most: it never resets a
-- count. The figures are measured from the reading itself.
--
-- Reply: {code, index, now_us, then per limit five integers: allowed, remaining (permits),
-- retry_after (us, rounded up), retry_short (the nanoseconds, 0 to 999, by which retry_after
-- overstates the exact wait), reset_after (us)}; code 1 = allowed (and committed), 0 = denied,
-- -1 = KEYS[index] holds another type (nothing written). Every number is an integer below 2^53:
-- a product of a count and a time, which can exceed it, is formed only below it (see mul_div).
-- A plan of one limit decided without reserving replies that limit's figures alone (plan.lua).

-- `expiry_slack_ms`, `n`, `peek` and `now` come from prelude.lua and `div` from div.lua, run
-- first; plan.lua, run last, decides the plan, with the decision below written in at each of
-- its `-- @decide` lines and the commit at each `-- @commit` (see `src/redis/script.rs`).

-- floor(a * b / d) and (a * b) mod d, for a below 2^32 and b, d below 2^51, whose quotient is
-- below 2^53. A product below 2^53 is exact in a double, and a double's product of integers
-- reaches 2^53 only if the exact one does, so the usual case divides it at once. Else a * b (up
-- to 2^83) is never formed: a's bits from the highest, doubling the quotient and remainder and
-- adding b's, with the remainder kept below d (so below 2^52).
local function mul_div(a, b, d)
  local product = a * b
  if product < 9007199254740992 then
    local q = div(product, d)
    return q, product - q * d
  end
  local bq = div(b, d)
  local br = b - bq * d
  local q, r = 0, 0
  local bit = 2147483648
  while bit >= 1 do
    q, r = q * 2, r * 2
    if r >= d then
      q, r = q + 1, r - d
    end
    if a >= bit then
      a = a - bit
      q, r = q + bq, r + br
      if r >= d then
        q, r = q + 1, r - d
      end
    end
    bit = bit / 2
  end
  return q, r
end

-- @decide
-- Limit i's state, for its commit (`state`), and its figures; the read's error alone (in
-- `state`) if KEYS[i] is not a hash. Run inside `repeat ... until true`: `break` ends it.
local base = 3 + 2 * (i - 1)
local limit, window = ARGV[base + 1] + 0, ARGV[base + 2] + 0
local stored = redis.pcall('HMGET', KEYS[i], 'w', 'c', 'p')
if stored.err ~= nil then
  state = stored
  break
end
local w, c, p = tonumber(stored[1]), tonumber(stored[2]), tonumber(stored[3])
local s = {window = window, index = div(now, window), cur = 0, prev = 0}
-- A commit to a missing key creates it: it then names its incarnation (see the commit).
s.created = not stored[1] and not stored[2] and not stored[3]
if w ~= nil and c ~= nil and p ~= nil then
  c, p = math.min(c, limit), math.min(p, limit)
  if now < w * window then
    -- Behind the stored window: counted at its start.
    s.index, s.cur, s.prev = w, c, p
  elseif s.index == w then
    s.cur, s.prev = c, p
  elseif s.index == w + 1 then
    -- The stored window's count weighs on the next window only.
    s.prev = c
  end
end
local e = math.max(now - s.index * window, 0)
-- The decision for `take` permits: one for a peek (what one permit would get: the quota if it
-- fits, else its denial), else n (0 reports what is available). Written out here rather than
-- as functions: each function is a closure made on every call.
local take = n
if peek then
  take = 1
end
-- The previous window's count weighted by the part of it the sliding window still covers,
-- rounded up: ceil(prev * (W - e) / W), at most prev.
local weight, weight_rest = mul_div(s.prev, window - e, window)
if weight_rest > 0 then
  weight = weight + 1
end
local room = limit - s.cur
-- The current window's count the reset is measured from: after a grant, with its permits.
local counted = s.cur
local allowed, remaining, retry, short = 1, math.max(room - weight, 0), 0, 0
if take > 0 and take <= room and weight <= room - take then
  if not peek then
    remaining, counted = room - take - weight, s.cur + take
  end
elseif take > 0 then
  -- Refused. The exact wait until `take` permits fit if nothing more is taken, as whole
  -- microseconds rounded up and the nanoseconds they overstate it by: the first instant at
  -- which ceil(P' * (W - e') / W) + C' + take <= limit. While cur + take <= limit it lies in
  -- this window or at the start of the next, where the previous count's weight must fall to
  -- floor((limit - cur - take) * W / prev); otherwise in the next window, where cur weighs as
  -- the previous count, or at the start of the one after: the weight must fall to
  -- floor((limit - take) * W / cur). Times in nanoseconds (W_ns = 1000 W) are kept as whole
  -- microseconds and a part below one.
  allowed = 0
  local index, weighing, fits = s.index, s.prev, limit - s.cur - take
  if s.cur + take > limit then
    index, weighing, fits = s.index + 1, s.cur, limit - take
  end
  weighing = math.max(weighing, 1)
  -- The weight in nanoseconds: floor(fits * 1000 * W / weighing) = 1000 * q + floor(1000 * r /
  -- weighing), below W_ns since the request does not fit at the weight now.
  local q, r = mul_div(fits, window, weighing)
  short = div(1000 * r, weighing)
  if q >= window then
    q, short = window, 0
  end
  -- The instant (index + 1) * W_ns - weight, less now: 1000 * (until - q) - short ns.
  retry = (index + 1) * window - now - q
end
-- Microseconds from now until the estimate is 0 if nothing more is taken: the start of the
-- window after next while the current window holds a permit, of the next while only the
-- previous one does, now if neither does.
local reset = 0
if counted > 0 then
  reset = (s.index + 2) * window - now
elseif s.prev > 0 then
  reset = (s.index + 1) * window - now
end
state = s
f1, f2, f3, f4, f5 = allowed, remaining, retry, short, reset

-- @commit
local s = state
if s.created then
  -- A new key names its incarnation (`i`, the server's time when it was made), so that a grant
  -- made on an earlier one is never given back to it (see give_back.lua).
  local time = redis.call('TIME')
  redis.call('HSET', KEYS[i], 'w', s.index, 'c', s.cur + n, 'p', s.prev, 'i',
    time[1] .. '.' .. time[2])
else
  redis.call('HSET', KEYS[i], 'w', s.index, 'c', s.cur + n, 'p', s.prev)
end
-- The estimate is 0 once the window after this one ends; the counter is then
-- indistinguishable from a missing key: expire it then.
local until_zero = (s.index + 2) * s.window - now
redis.call('PEXPIRE', KEYS[i], math.floor(until_zero / 1000) + expiry_slack_ms)
