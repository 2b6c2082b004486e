-- Sliding window log for every limit of one plan: checks all, then commits all or none.
--
-- KEYS[i]   the log of limit i: a sorted set of admissions scored by their expiry (admission time
--           + window, in microseconds). A missing key is an empty log.
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
-- Reply: {code, index, now_us, then per limit: allowed, remaining (permits), retry_after (us),
-- reset_after (us)}; code 1 = allowed (and committed), 0 = denied, -1 = KEYS[index] holds another
-- type (nothing written). Every figure is an integer below 2^53.

-- `int`, `expire_after`, `read_own`, `n`, `peek`, `now` and `decide_plan` come from prelude.lua,
-- run first.

-- Limit i's admission time (and its digits), window and live count, for its commit, and its
-- figures; nothing if KEYS[i] is not a sorted set.
local function decide_limit(i)
  local base = 3 + 2 * (i - 1)
  local limit, window = ARGV[base + 1] + 0, ARGV[base + 2] + 0
  local newest = read_own('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
  if not newest then
    return nil
  end
  local latest = 0
  if newest[2] ~= nil then
    latest = tonumber(newest[2])
  end
  local time = math.max(now, latest - window)
  local time_digits = int(time)
  local after_time = '(' .. time_digits
  -- Admissions still in the window at `time`: those that expire after it.
  local live = redis.call('ZCOUNT', KEYS[i], after_time, '+inf')
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
      local k = live + wanted - limit - 1
      local leaving = redis.call('ZRANGEBYSCORE', KEYS[i], after_time, '+inf', 'WITHSCORES', 'LIMIT', k, 1)
      allowed, retry = 0, math.max(tonumber(leaving[2]) - now, 0)
    elseif not peek then
      remaining, reset = limit - live - n, time + window - now
    end
  end
  return {time, window, live, time_digits}, allowed, remaining, retry, reset
end

local function commit_limit(i, counted)
  local time, window, live, time_digits = counted[1], counted[2], counted[3], counted[4]
  local expiry = int(time + window)
  -- Admissions that have left the window stay out of it (time never goes back): drop them.
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', time_digits)
  -- Members must be unique: admissions with one expiry all happen at one `time`, each seeing
  -- one more live admission than the one before, so the count tells them apart.
  for j = 0, n - 1 do
    redis.call('ZADD', KEYS[i], expiry, expiry .. ':' .. int(live + j))
  end
  -- When the newest admission leaves the window the log is empty: expire it then.
  expire_after(KEYS[i], time + window - now)
end

return decide_plan(decide_limit, commit_limit)
