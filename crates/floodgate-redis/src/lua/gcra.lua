-- GCRA. Arguments: key, cost n, write, T (emission interval, us), B (burst).
-- State: the theoretical arrival time (TAT) in microseconds, a string.
local function gcra(key, n, write, t, b)
  local tat = now
  local stored = redis.call('GET', key)
  if stored then
    local s = string.match(stored, '^%d+$') and tonumber(stored)
    if not s or s >= EXACT then return malformed(key, 'not a whole number below 2^53') end
    -- A server clock that reads earlier never moves the state back: tat = max(TAT, now).
    if s > tat then tat = s end
  end
  local limit_at = now + b * t
  local function remaining_at(x)
    return fdiv(limit_at - x, t)
  end
  if n > b then
    return reply(false, b, remaining_at(tat), tat - now, -1)
  end
  if n == 0 then
    return reply(true, b, remaining_at(tat), tat - now, 0)
  end
  local new_tat = tat + n * t
  if new_tat <= limit_at then
    if write then set_state(key, fmt(new_tat), new_tat - now) end
    return reply(true, b, remaining_at(new_tat), new_tat - now, 0)
  end
  return reply(false, b, remaining_at(tat), tat - now, new_tat - limit_at)
end
