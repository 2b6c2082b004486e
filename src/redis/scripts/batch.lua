-- Several requests' decisions in one call (`src/redis/script.rs` writes a method's batch script
-- from this frame, for `RedisRateLimiterBuilder::batch_size`). Each request is decided by the
-- very text of the method's script for one request (prelude.lua and plan.lua around the
-- method's decision and commit), made a function here, whose reads of KEYS and ARGV are offset
-- to the request's own: in the order given, in one atomic step, as if each had been a call of
-- its own at the instant the batch read.
--
-- ARGV[1]   the number of requests
-- then, per request: how many arguments it has (a), how many keys (k), then its a arguments as
--           the method's script takes them (n, the mode, the time, each limit's parameters)
-- KEYS      each request's k keys, in the order of the requests
--
-- Reply: one item per request, in order: the reply a call of it alone would give, or
-- {-2, message} for the error it raised (Redis's own reply, as the client reads it, would be an
-- error for the whole call if one of its items were one). A request's error ends its own
-- decision only (what it wrote before the error stands, as for a call alone); the requests
-- after it are decided all the same.
--
-- The server's clock is read once, for every request of the batch that brings no time of its
-- own: the batch is one instant.
local batch_time = redis.call('TIME')
-- @definitions
local function decide_one(ko, ao, limit_count)
-- @request
end
local replies = {}
local ko, ao = 0, 1
for r = 1, ARGV[1] + 0 do
  local args, keys = ARGV[ao + 1] + 0, ARGV[ao + 2] + 0
  local ok, reply = pcall(decide_one, ko, ao + 2, keys)
  if not ok then
    -- A command's error (a table {err = message}, or its message) is led by its code, as
    -- `OOM ...` or `WRONGTYPE ...`; Lua's own error (such as arithmetic on a value that is no
    -- number) is led by its place in the script, `user_script:LINE: ...`, to which Redis would
    -- give the code ERR in the reply to a call of its own.
    if type(reply) == 'table' then
      reply = reply.err
    end
    reply = tostring(reply)
    if not string.find(reply, '^[A-Z]+ ') then
      reply = 'ERR ' .. reply
    end
    reply = {-2, reply}
  end
  replies[r] = reply
  ko, ao = ko + keys, ao + 2 + args
end
return replies
