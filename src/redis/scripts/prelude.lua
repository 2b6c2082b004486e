-- What every script starts with (`src/redis/script.rs` puts it first): the arguments they share,
-- the clock and the keys' expiry. `plan.lua`, put last, decides the plan around the script's own
-- decision for one limit. Every function made here is made again on every call (a closure each,
-- and garbage), so the shared parts are values and top-level code, not functions.
--
-- ARGV[1]   n, the permits asked for
-- ARGV[2]   "acquire", "peek", or "reserve" ("reserve-log" for the sliding log: acquire, and
--           report what a give-back needs; see plan.lua)
-- ARGV[3]   the time in microseconds, or "" for the server's TIME (the normal case)

-- A number handed to `redis.call` as a number is written by Redis itself, exactly for an integer
-- below 2^53 (as '%.17g' before Redis 7.2, as an integer since), and costs no Lua string: every
-- integer argument goes so. (Lua's own number-to-string conversion, in a concatenation, keeps
-- only 14 significant digits, and times in microseconds have 16.)

-- Arguments and replies known to be numbers are converted by arithmetic (`x + 0`): `tonumber`
-- parses a string twice.
local n = ARGV[1] + 0
local peek = ARGV[2] == 'peek'
-- "reserve-log" is the sliding log's reserve (see plan.lua).
local reserve_log = ARGV[2] == 'reserve-log'
local reserve = ARGV[2] == 'reserve' or reserve_log
local injected = ARGV[3] ~= ''
local now
if injected then
  now = ARGV[3] + 0
else
  local time = redis.call('TIME')
  now = time[1] * 1000000 + time[2]
end

-- A key indistinguishable from a missing one `us` microseconds from now expires
-- `math.floor(us / 1000) + expiry_slack_ms` milliseconds from now: then, rounded up to whole
-- milliseconds. An injected time runs apart from the server's clock, so such keys are kept a
-- minute longer. (A number, not a function: no closure per call.)
local expiry_slack_ms = 1
if injected then
  expiry_slack_ms = 60001
end
