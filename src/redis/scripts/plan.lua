-- The plan's decision, all or nothing, around the script's own decision for one limit (put last
-- by `src/redis/script.rs`, which writes the method's decision in at each `-- @decide` line and
-- its commit at each `-- @commit` line: inline, since a function would be a closure made and
-- collected on every call, about 2,000 server instructions each).
--
-- The decision of limit i (`i` in scope, with `n`, `peek` and `now`) reads its key with
-- `redis.pcall`, first, so that no decision pays for a `TYPE`: the read's own WRONGTYPE error
-- tells another program's key under our name from ours. If the read failed it sets `state` to
-- the error and leaves `f1` nil. Else it sets `state` to what the commit needs to write the
-- limit, and `f1` .. `f5` to the limit's four or five reply figures, allowed first. The commit
-- of limit i writes `state`.
--
-- The reply: {-1, i, now} if KEYS[i] holds another type, nothing written (no limit commits
-- before every limit has read its key); any other error of a read is raised as it came. Else,
-- for a plan of one limit decided without reserving, that limit's figures alone; otherwise
-- {1, 0, now} and every limit's figures in order, with code 0 if any limit refused. Only if none
-- refused and permits are taken (neither a peek nor n = 0) is every limit committed; a refused
-- plan's limits that would have granted report their figures for 0 permits.
--
-- A reserving call (ARGV[2] "reserve") names one more key, last: the grant's record, a key of
-- its own (the caller's unique name, in the plan's hash slot). When it commits, it writes the
-- record (which `give_back.lua` consumes, so that a grant is given back at most once, and not
-- after GRANT_LIFETIME_MS) and appends, per limit's key in order, what `give_back.lua` needs to
-- undo the grant: the key's value before the commit (`DUMP`, nil for a missing key), the Unix
-- time in milliseconds it was to expire (`PEXPIRETIME`; 0 for none), its value after the commit
-- (`DUMP`), the window index the grant counted in (the hash field `w`; -1 for a key without
-- one), and the key's incarnation (the windows' field `i`; nil for a key without one). A sliding log ("reserve-log") may hold tens of thousands of batches, too many to copy:
-- its values are its members, each followed by its score, space-separated: before the commit,
-- its newest batch and the DROP_PER_COMMIT oldest (all that a commit may remove), after, its
-- newest.

local limits = #KEYS
if reserve then
  limits = limits - 1
end
local reply, states
for i = 1, limits do
  -- Figures as values, not a list: no table per limit for the collector to sweep.
  local state, f1, f2, f3, f4, f5
  -- @decide
  if f1 == nil then
    if string.sub(state.err, 1, 9) == 'WRONGTYPE' then
      return {-1, i, now}
    end
    error(state)
  end
  if limits == 1 and not reserve then
    -- The usual plan, of one limit: no list of states, and a reply of its figures alone (its
    -- code is the limit's own allowed figure; each item of a reply costs the server).
    if f1 == 1 and not peek and n ~= 0 then
      -- @commit
    end
    return {f1, f2, f3, f4, f5}
  end
  if i == 1 then
    reply, states = {1, 0, now}, {}
  end
  if f1 == 0 then
    reply[1] = 0
  end
  states[i] = state
  local at = #reply
  -- A missing fifth figure is nil, and storing nil past the end leaves the reply as it is.
  reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] = f1, f2, f3, f4, f5
end

if reply[1] == 0 and not peek and n ~= 0 then
  -- A refused plan takes nothing: a limit that would have granted reports its figures as they
  -- stand (decided again for 0 permits), not as after a grant that did not happen.
  n = 0
  for i = 1, limits do
    -- Every limit of a plan is of one method, with as many figures as the others.
    local at = 3 + (i - 1) * (#reply - 3) / limits
    if reply[at + 1] == 1 then
      local state, f1, f2, f3, f4, f5
      -- @decide
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
if not reserve then
  for i = 1, limits do
    local state = states[i]
    -- @commit
  end
  return reply
end
-- The grant's record lives as long as the grant may be given back (the Rust side says
-- `RedisRateLimiter::GRANT_LIFETIME`).
local GRANT_LIFETIME_MS = 10000
redis.call('SET', KEYS[limits + 1], 1, 'PX', GRANT_LIFETIME_MS)
for i = 1, limits do
  local key = KEYS[i]
  local before
  if reserve_log then
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if newest[1] ~= nil then
      local parts = {newest[1], newest[2]}
      local oldest = redis.call('ZRANGE', key, 0, DROP_PER_COMMIT - 1, 'WITHSCORES')
      for j = 1, #oldest do
        parts[#parts + 1] = oldest[j]
      end
      before = table.concat(parts, ' ')
    else
      before = false
    end
  else
    before = redis.call('DUMP', key)
  end
  -- Expiries are kept as absolute times on the server's clock (an injected `now` is not it), so
  -- that the give-back, a later call, restores the time left then.
  local expires = 0
  if before then
    expires = math.max(redis.call('PEXPIRETIME', key), 0)
  end
  local state = states[i]
  -- @commit
  -- The token bucket's key is a string: the read's error says it has no window.
  local window = redis.pcall('HGET', key, 'w')
  if type(window) == 'string' then
    window = window + 0
  else
    window = -1
  end
  local after
  if reserve_log then
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    after = newest[1] .. ' ' .. newest[2]
  else
    after = redis.call('DUMP', key)
  end
  local incarnation = redis.pcall('HGET', key, 'i')
  if type(incarnation) ~= 'string' then
    incarnation = false
  end
  local at = #reply
  reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] =
    before, expires, after, window, incarnation
end
return reply
