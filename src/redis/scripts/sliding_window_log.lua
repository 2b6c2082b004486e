-- Sliding window log for every limit of one plan: checks all, then commits all or none.
--
-- KEYS[i]   the log of limit i: a sorted set of batches, one per instant that admitted permits,
--           scored by their expiry (admission time + window, in microseconds), each member
--           "<after>:<count>": the batch's permits, and the log's running total of admissions
--           up to and including them. A missing key is an empty log.
-- ARGV[1]   n, from 0 to the smallest limit (0 reports what is available and writes nothing)
-- ARGV[2]   "acquire" or "peek" (peek: what one permit would get, writing nothing)
-- ARGV[3]   the time in microseconds, or "" for the server's TIME (the normal case)
-- ARGV[3 + 2(i-1) + 1 .. 2]  limit i: limit, window_us
--
-- n admissions are allowed iff at most `limit - n` admissions are still in the window; they all
-- happen at one time, the later of now and the latest admission's, so the log stays sorted even if
-- the server's clock steps back. A refusal waits for the admission whose leaving makes room for
-- n.
--
-- Work and memory do not grow with n. A request of n permits adds one batch (or joins the newest
-- batch, when it has the same expiry, so expiries are unique and the set's order is that of the
-- running totals). The live admissions are the newest batch's total minus the total before the
-- oldest batch still in the window; the admission whose leaving makes room is found in the oldest
-- live batch, or else by a binary search of the batches by rank on their totals. A commit drops
-- at most DROP_PER_COMMIT batches that have left the window, so a request reads and writes
-- O(log(batches)) elements with O(log(batches)) calls at most. Every batch holds at least one
-- live permit when added, and a commit either drops every batch that has left the window or
-- drops DROP_PER_COMMIT of them and adds at most one, so a log holds at most `limit` batches:
-- 20-30 bytes each while the set is a listpack (up to 128 members), about 100 each beyond (see
-- `src/redis/mod.rs`).
--
-- Reply: {code, index, now_us, then per limit: allowed, remaining (permits), retry_after (us),
-- reset_after (us)}; code 1 = allowed (and committed), 0 = denied, -1 = KEYS[index] holds another
-- type (nothing written). Every figure is an integer below 2^53.
-- A plan of one limit decided without reserving replies that limit's figures alone (plan.lua).

-- `expiry_slack_ms`, `n`, `peek` and `now` come from prelude.lua, run first; plan.lua, run last,
-- decides the plan, with the decision below written in at each of its `-- @decide` lines and the
-- commit at each `-- @commit` (see `src/redis/script.rs`).

-- The digits of a positive integer below 2^53, for joining into a member: Lua's own
-- number-to-string conversion keeps only 14 significant digits, and times in microseconds have
-- 16. '%d' is much the cheaper and writes the same digits for a positive integer that fits a C
-- long, which may have only 32 bits: it writes those below 2^31 (counts), '%.0f' the rest.
local function int(x)
  if x > 0 and x < 2147483648 and x % 1 == 0 then
    return string.format('%d', x)
  end
  return string.format('%.0f', x)
end

-- Batches that have left the window one commit drops at most: bounded work per request.
local DROP_PER_COMMIT = 16

-- A batch's running total and its permits, from its member (written by this script: numbers).
local function batch_of(member)
  local colon = string.find(member, ':', 1, true)
  return string.sub(member, 1, colon - 1) + 0, string.sub(member, colon + 1) + 0
end

-- The expiry of the batch holding the admission with running total `target` (counting from 0),
-- searched among the batches of ranks `low` to `high`, whose last holds it.
local function expiry_holding(key, target, low, high)
  while low < high do
    local middle = math.floor((low + high) / 2)
    local after = batch_of(redis.call('ZRANGE', key, middle, middle)[1])
    if after > target then
      high = middle
    else
      low = middle + 1
    end
  end
  return redis.call('ZRANGE', key, low, low, 'WITHSCORES')[2] + 0
end

-- @decide
-- Limit i's state for its commit (`state`), and its figures; the read's error alone (in
-- `state`) if KEYS[i] is not a sorted set. Run inside `repeat ... until true`: `break` ends it.
local base = 3 + 2 * (i - 1)
local limit, window = ARGV[base + 1] + 0, ARGV[base + 2] + 0
local key = KEYS[i]
local newest = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
if newest.err ~= nil then
  state = newest
  break
end
local latest, total, newest_count = 0, 0, 0
if newest[1] ~= nil then
  total, newest_count = batch_of(newest[1])
  latest = newest[2] + 0
end
local time = math.max(now, latest - window)
local time_digits = int(time)
-- Admissions still in the window at `time`, those that expire after it: every admission from
-- the oldest such batch on.
-- The rank of the oldest live batch, when known without a count: 0 for an empty log.
local live, before_live, first_after, first_expiry, first_rank = 0, total, 0, 0, nil
if newest[1] == nil then
  first_rank = 0
elseif latest > time then
  -- The oldest batch is usually still in the window, and then no batch has left it; else the
  -- oldest live batch is found by its expiry.
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] + 0 > time then
    first_rank = 0
  else
    first = redis.call('ZRANGEBYSCORE', key, '(' .. time_digits, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  end
  local first_count
  first_after, first_count = batch_of(first[1])
  first_expiry = first[2] + 0
  before_live = first_after - first_count
  live = total - before_live
end
local reset = math.max(latest - now, 0)
local allowed, remaining, retry = 1, math.max(limit - live, 0), 0
local wanted = n
if peek then
  wanted = 1
end
if wanted >= 1 then
  if live + wanted > limit then
    -- The admissions still in the window leave oldest first; room for `wanted` comes when the
    -- (live + wanted - limit)-th of them has left.
    local target = before_live + live + wanted - limit - 1
    local leaving = first_expiry
    if target >= first_after then
      first_rank = first_rank or redis.call('ZCOUNT', key, '-inf', time_digits)
      local last_rank = redis.call('ZCARD', key) - 1
      leaving = expiry_holding(key, target, first_rank + 1, last_rank)
    end
    allowed, retry = 0, math.max(leaving - now, 0)
  elseif not peek then
    remaining, reset = limit - live - n, time + window - now
  end
end
state = {time, window, time_digits, total, latest, newest[1], newest_count, first_rank}
f1, f2, f3, f4 = allowed, remaining, retry, reset

-- @commit
local time, window, time_digits, total = state[1], state[2], state[3], state[4]
local latest, newest_member, newest_count, first_rank = state[5], state[6], state[7], state[8]
local key = KEYS[i]
local expiry = time + window
-- Batches that have left the window stay out of it (time never goes back): drop the oldest of
-- them, a bounded number per commit.
local left = first_rank or redis.call('ZCOUNT', key, '-inf', time_digits)
if left > 0 then
  redis.call('ZREMRANGEBYRANK', key, 0, math.min(left, DROP_PER_COMMIT) - 1)
end
local count = n
if expiry == latest then
  -- Admitted at the newest batch's instant: join it, so that expiries stay unique.
  redis.call('ZREM', key, newest_member)
  count = newest_count + n
end
redis.call('ZADD', key, int(expiry), int(total + n) .. ':' .. int(count))
-- When the newest admission leaves the window the log is empty: expire it then.
redis.call('PEXPIRE', key, math.floor((time + window - now) / 1000) + expiry_slack_ms)
