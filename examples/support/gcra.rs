//! A GCRA script of the shape Redis rate limiters commonly use, measured beside tollgate's
//! scripts by the Redis examples.

/// GCRA with its state in one string (the TAT in seconds), of the shape rate limiters commonly
/// use (for example go-redis/redis_rate's `allowN`): `TIME`, `GET`, and `SET ... EX` when it
/// allows. Written here to measure that shape, not taken from any of them.
/// KEYS[1] the TAT; ARGV: burst, rate, period (s), cost.
pub(crate) const GCRA: &str = r"
local burst, rate, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local interval = period / rate
local clock = redis.call('TIME')
local now = (clock[1] - 1600000000) + clock[2] / 1000000
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then
  tat = now
end
local new_tat = tat + interval * cost
local diff = now - (new_tat - interval * burst)
if diff < 0 then
  return {0, 0, tostring(-diff), tostring(tat - now)}
end
local reset = new_tat - now
redis.call('SET', KEYS[1], new_tat, 'EX', math.ceil(reset))
return {cost, diff / interval, '-1', tostring(reset)}
";

/// A call of `script` (the GCRA script, or one measured as it is) on `key` under a limit no run
/// reaches: burst and rate 60,000 an hour, one permit a call.
pub(crate) fn allowed_call<'a>(
    script: &'a redis::Script,
    key: &str,
) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.key(key);
    invocation.arg(60_000).arg(60_000).arg(3_600).arg(1);
    invocation
}
