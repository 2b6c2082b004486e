-- What every script starts with (prepended to each by `src/redis/script.rs`): the arguments they
-- share, the clock, integer helpers, the keys' expiry, the first read of a key (which tells
-- another program's key from ours), and the plan's decision, all or nothing, around each
-- script's own decision for one limit.
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

-- Arguments and replies known to be numbers are converted by arithmetic (`x + 0`): `tonumber`
-- parses a string twice.
local n = ARGV[1] + 0
local peek = ARGV[2] == 'peek'
local injected = ARGV[3] ~= ''
local now
if injected then
  now = ARGV[3] + 0
else
  local time = redis.call('TIME')
  now = time[1] * 1000000 + time[2]
end

-- Sets `key` to expire `us` microseconds from now, rounded up to whole milliseconds: when it has
-- become indistinguishable from a missing key. An injected time runs apart from the server's
-- clock, so such keys are kept a minute longer.
local function expire_after(key, us)
  local ttl = math.floor(us / 1000) + 1
  if injected then
    ttl = ttl + 60000
  end
  redis.call('PEXPIRE', key, int(ttl))
end

-- The reply of the command `...` (a read of one of KEYS), or false if that key holds another
-- type than the command reads (another program's key under our name). Each limit reads its key
-- with this first, so that no decision pays for a `TYPE`: the read's own WRONGTYPE error says
-- it. Any other error is raised as it came.
local function read_own(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err ~= nil then
    if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
      return false
    end
    error(reply)
  end
  return reply
end

-- Decides every limit of the plan, all or nothing, and returns the reply (see
-- `src/redis/script.rs`). `decide_limit(i)` reads limit i (first with `read_own`) and returns
-- what `commit_limit(i, state)` needs to write it, then the limit's four or five reply figures,
-- allowed first; or nothing if KEYS[i] holds another type, and the reply is then {-1, i, now},
-- nothing written (no limit commits before every limit has read its key). Else the reply is
-- {1, 0, now} and every limit's figures in order, with code 0 if any limit refused. Only if none
-- refused and permits are taken (neither a peek nor n = 0) is every limit committed.
local function decide_plan(decide_limit, commit_limit)
  if #KEYS == 1 then
    -- The usual plan, of one limit: no list of states, and the reply made at its full size.
    local state, f1, f2, f3, f4, f5 = decide_limit(1)
    if f1 == nil then
      return {-1, 1, now}
    end
    if f1 == 1 and not peek and n ~= 0 then
      commit_limit(1, state)
    end
    return {f1, 0, now, f1, f2, f3, f4, f5}
  end
  local reply = {1, 0, now}
  local states = {}
  local starts = {}
  for i = 1, #KEYS do
    -- Figures as values, not a list: no table per limit for the collector to sweep.
    local state, f1, f2, f3, f4, f5 = decide_limit(i)
    if f1 == nil then
      return {-1, i, now}
    end
    if f1 == 0 then
      reply[1] = 0
    end
    states[i] = state
    local at = #reply
    starts[i] = at
    -- A missing fifth figure is nil, and storing nil past the end leaves the reply as it is.
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] = f1, f2, f3, f4, f5
  end

  if reply[1] == 0 and not peek and n ~= 0 then
    -- A refused plan takes nothing: a limit that would have granted reports its figures as they
    -- stand (decided again for 0 permits), not as after a grant that did not happen.
    n = 0
    for i = 1, #KEYS do
      local at = starts[i]
      if reply[at + 1] == 1 then
        local _, f1, f2, f3, f4, f5 = decide_limit(i)
        reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = f1, f2, f3, f4
        if f5 ~= nil then
          reply[at + 5] = f5
        end
      end
    end
    return reply
  end
  if reply[1] == 0 or peek or n == 0 then
    return reply
  end
  for i = 1, #KEYS do
    commit_limit(i, states[i])
  end
  return reply
end
