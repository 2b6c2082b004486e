-- What every script starts with (prepended to each by `src/redis/script.rs`): the arguments they
-- share, the clock, integer helpers, the keys' expiry, the check that their keys are theirs, and
-- the plan's decision, all or nothing, around each script's own decision for one limit.
--
-- ARGV[1]   n, the permits asked for
-- ARGV[2]   "acquire" or "peek"
-- ARGV[3]   the time in microseconds, or "" for the server's TIME (the normal case)

-- Numbers go to Redis as exact integer strings: Lua's own number-to-string conversion keeps only
-- 14 significant digits, and times in microseconds have 16. '%d' is much the cheaper and writes
-- the same digits for a positive integer that fits a C long, which may have only 32 bits: it
-- writes those below 2^31 (counts, expiries), '%.0f' the rest (times).
local function int(x)
  if x > 0 and x < 2147483648 and x % 1 == 0 then
    return string.format('%d', x)
  end
  return string.format('%.0f', x)
end

-- floor(a / b) for integers below 2^53, corrected for the division's rounding.
local function div(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local n = tonumber(ARGV[1])
local peek = ARGV[2] == 'peek'
local now
if ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- Sets `key` to expire `us` microseconds from now, rounded up to whole milliseconds: when it has
-- become indistinguishable from a missing key. An injected time runs apart from the server's
-- clock, so such keys are kept a minute longer.
local function expire_after(key, us)
  local ttl = math.floor(us / 1000) + 1
  if ARGV[3] ~= '' then
    ttl = ttl + 60000
  end
  redis.call('PEXPIRE', key, int(ttl))
end

-- The position of the first key that holds something other than `kind` (another program's
-- key under our name), or nil: nothing may be written then.
local function key_of_another_type(kind)
  for i = 1, #KEYS do
    local found = redis.call('TYPE', KEYS[i])['ok']
    if found ~= 'none' and found ~= kind then
      return i
    end
  end
  return nil
end

-- Decides every limit of the plan, all or nothing, and returns the reply (see
-- `src/redis/script.rs`). If KEYS[i] holds something other than `kind`: {-1, i, now}, nothing
-- written. Else `decide_limit(i)` reads limit i and returns what `commit_limit(i, state)` needs to
-- write it, then the limit's four or five reply figures, allowed first; the reply is {1, 0, now}
-- and every limit's figures in order, with code 0 if any limit refused. Only if none refused and
-- permits are taken (neither a peek nor n = 0) is every limit committed.
local function decide_plan(kind, decide_limit, commit_limit)
  local other = key_of_another_type(kind)
  if other then
    return {-1, other, now}
  end

  local reply = {1, 0, now}
  local states = {}
  for i = 1, #KEYS do
    -- Figures as values, not a list: no table per limit for the collector to sweep.
    local state, f1, f2, f3, f4, f5 = decide_limit(i)
    if f1 == 0 then
      reply[1] = 0
    end
    states[i] = state
    local at = #reply
    -- A missing fifth figure is nil, and storing nil past the end leaves the reply as it is.
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] = f1, f2, f3, f4, f5
  end

  if reply[1] == 0 or peek or n == 0 then
    return reply
  end
  for i = 1, #KEYS do
    commit_limit(i, states[i])
  end
  return reply
end
