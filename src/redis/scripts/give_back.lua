-- Gives back a grant made by a reserving call (see plan.lua), for every limit of its plan, so
-- that a request refused by another of its limits is charged nothing. Run alone (no prelude).
--
-- KEYS[i]   limit i's key, as the reserving call named it; the last, the grant's record
-- ARGV[1]   n, the permits granted
-- ARGV[2]   the method: "fixed_window", "sliding_window_counter", or another (the token bucket,
--           the sliding log)
-- ARGV[2 + 5(i-1) + 1 .. 5]  what the reserving call reported for key i: its value before the
--           grant (a `DUMP`, or "" for a missing key), the Unix time in milliseconds it was to
--           expire (0: never), its value after the grant (a `DUMP`), the window index the grant
--           counted in (-1: none), the key's incarnation ("" for none: the windows' field `i`,
--           which a key gets when a decision makes it, so that a key deleted and made again
--           since the grant, whose count may repeat the earlier key's, is never given to). A sliding log's values are members and scores instead (see
--           plan.lua): its grant is undone while its batch is still the newest, as written.
--
-- A key whose value is still the grant's own (no other decision has landed on it) gets its
-- value from before back, with the expiry it had: exactly as if the grant had not been made.
-- Otherwise, for the windows, the permits come off the window they were counted in, if the key
-- still counts it (never below 0): a decision made after the grant saw more permits taken than
-- it would have without it, so a grant it made stands either way, and the count is then what it
-- would have been without the grant. The token bucket and the sliding log keep such a grant:
-- what other decisions wrote since cannot be told apart from it, and it leaves as they do
-- (refilled at the bucket's rate, or out of the log's window).
--
-- The grant's record, written by the reserving call, is consumed first: without it (given back
-- already, older than its lifetime, or lost with the server's data) nothing is given back, so
-- that no grant is given back twice, nor onto a state rebuilt since (a decision made on a
-- rebuilt or restored key can write the very value the grant wrote).
--
-- Reply: per key, 1 restored, 2 taken off its window, 0 kept.

local n = ARGV[1] + 0
local method = ARGV[2]
local limits = #KEYS - 1
local reply = {}
if redis.call('DEL', KEYS[limits + 1]) == 0 then
  for i = 1, limits do
    reply[i] = 0
  end
  return reply
end
for i = 1, limits do
  local key = KEYS[i]
  local base = 2 + 5 * (i - 1)
  local before, after, window = ARGV[base + 1], ARGV[base + 3], ARGV[base + 4] + 0
  local incarnation = ARGV[base + 5]
  local outcome = 0
  if method == 'sliding_window_log' then
    local newest = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    if newest.err == nil and newest[1] ~= nil and newest[1] .. ' ' .. newest[2] == after then
      -- Its batch out, and every batch the commit joined or dropped back (those still there
      -- are written again as they are).
      redis.call('ZREM', key, newest[1])
      for member, score in string.gmatch(before, '(%S+) (%S+)') do
        redis.call('ZADD', key, score, member)
      end
      local expires = ARGV[base + 2] + 0
      if before ~= '' and expires > 0 then
        redis.call('PEXPIREAT', key, expires)
      end
      outcome = 1
    end
  elseif redis.call('DUMP', key) == after then
    if before == '' then
      redis.call('DEL', key)
    else
      -- An expiry already past deletes the key, as its own expiry would have.
      redis.call('RESTORE', key, ARGV[base + 2], before, 'REPLACE', 'ABSTTL')
    end
    outcome = 1
  elseif window >= 0 and method == 'fixed_window' then
    local stored = redis.pcall('HMGET', key, 'w', 'c', 'i')
    if stored.err == nil and tonumber(stored[1]) == window and tonumber(stored[2]) ~= nil
      and (stored[3] or '') == incarnation then
      redis.call('HSET', key, 'c', math.max(stored[2] - n, 0))
      outcome = 2
    end
  elseif window >= 0 and method == 'sliding_window_counter' then
    -- The window counted in is the current one (`c`), or the one before it (`p`) once a later
    -- decision moved the counter to the next window.
    local stored = redis.pcall('HMGET', key, 'w', 'c', 'p', 'i')
    if stored.err == nil and (stored[4] or '') == incarnation then
      local w, c, p = tonumber(stored[1]), tonumber(stored[2]), tonumber(stored[3])
      if w == window and c ~= nil then
        redis.call('HSET', key, 'c', math.max(c - n, 0))
        outcome = 2
      elseif w == window + 1 and p ~= nil then
        redis.call('HSET', key, 'p', math.max(p - n, 0))
        outcome = 2
      end
    end
  end
  reply[i] = outcome
end
return reply
