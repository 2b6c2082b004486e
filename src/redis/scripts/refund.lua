-- Gives n permits back to every limit of a plan at `now`: a refund of permits taken earlier
-- (Envoy's `is_negative_hits`), by each method's own rule, never past what the limit still
-- counts, so that no key becomes more generous than a missing one. `src/redis/script.rs` puts
-- prelude.lua and div.lua first.
--
-- KEYS[i]   limit i's key
-- ARGV[1]   n, the permits given back
-- ARGV[2]   the method: "token_bucket", "fixed_window", "sliding_window_counter", or another
--           (the sliding log: nothing, since its batches record admissions)
-- ARGV[3]   the time in microseconds, or "" for the server's TIME (the normal case)
-- ARGV[3 + k(i-1) + 1 .. k]  limit i's parameters, as the method's decision script takes them
--
-- The token bucket moves its TAT back by n tokens, never before `now` (a full bucket at most);
-- the fixed window and the sliding window counter take n (at most the count) off the window
-- `now` lies in, if that is the stored window: a refund read in an older window than the stored
-- one (a server's clock stepped back) gives nothing, so that the count of the window it was
-- read in is never taken from another's. Every write keeps the key's expiry rule.
--
-- Reply: per key, 1 when permits were given back, 0 when none were.

local method = ARGV[2]
local reply = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local outcome = 0
  if method == 'token_bucket' then
    local base = 3 + 3 * (i - 1)
    local tpu, token, burst = ARGV[base + 1] + 0, ARGV[base + 2] + 0, ARGV[base + 3] + 0
    local stored = redis.pcall('GET', key)
    if type(stored) == 'string' then
      local t, f = tonumber(stored), 0
      if t == nil then
        local colon = string.find(stored, ':', 1, true)
        if colon ~= nil then
          t, f = tonumber(string.sub(stored, 1, colon - 1)), tonumber(string.sub(stored, colon + 1))
        end
      end
      -- A TAT more than two windows ahead can only come from a clock that stepped back: its
      -- debt is not exact in a double, and the refund leaves it.
      if t ~= nil and f ~= nil and t >= now and t - now <= 2 * (burst / tpu) then
        local debt = (t - now) * tpu + f
        if debt > 0 then
          local new_debt = math.max(debt - n * token, 0)
          -- The new TAT, now + new_debt ticks, as the decision script writes it.
          local q = math.floor(new_debt / tpu)
          local r = new_debt - q * tpu
          if r < 0 then
            q, r = q - 1, r + tpu
          elseif r >= tpu then
            q, r = q + 1, r - tpu
          end
          if r == 0 then
            redis.call('SET', key, now + q, 'PX', math.floor(q / 1000) + expiry_slack_ms)
          else
            redis.call('SET', key, string.format('%.0f:%.0f', now + q, r), 'PX',
              math.floor(q / 1000) + expiry_slack_ms)
          end
          outcome = 1
        end
      end
    end
  elseif method == 'fixed_window' or method == 'sliding_window_counter' then
    local window = ARGV[3 + 2 * (i - 1) + 2] + 0
    local stored = redis.pcall('HMGET', key, 'w', 'c')
    if stored.err == nil then
      local w, c = tonumber(stored[1]), tonumber(stored[2])
      if w ~= nil and c ~= nil and c > 0 and w == div(now, window) then
        redis.call('HSET', key, 'c', math.max(c - n, 0))
        outcome = 1
      end
    end
  end
  reply[i] = outcome
end
return reply
