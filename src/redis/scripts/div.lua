-- Integer division for the window scripts (`src/redis/script.rs` puts it after prelude.lua).

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
