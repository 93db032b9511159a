-- Sliding window counter. Arguments: key, cost n, write, P (period, us), L (limit).
-- State: "window:prev:cur" (prev = the count of window - 1).
local function sliding_window(key, n, write, p, l)
  local w = fdiv(now, p)
  local prev, cur = 0, 0
  local stored = redis.call('GET', key)
  if stored then
    local sw, sp, sc = string.match(stored, '^(%d+):(%d+):(%d+)$')
    sw, sp, sc = tonumber(sw), tonumber(sp), tonumber(sc)
    if not sw or not sp or not sc then return malformed(key, 'not window:prev:cur') end
    if sw >= w then
      -- Never back to an older window: an earlier reading is judged at the start
      -- of the stored one.
      w, prev, cur = sw, sp, sc
    elseif sw == w - 1 then
      prev = sc
    end
  end
  local start = w * p
  local at = now
  if start > at then at = start end
  local e = at - start
  -- estimate = floor(prev * (P - e) / P) + cur; prev * (P - e) <= L * P < 2^53.
  local estimate = fdiv(prev * (p - e), p) + cur
  local function reset(c)
    if c > 0 then return start + 2 * p - now end
    if prev > 0 then return start + p - now end
    return 0
  end
  if n > l then
    return reply(false, l, l - estimate, reset(cur), -1)
  end
  if n == 0 then
    return reply(true, l, l - estimate, reset(cur), 0)
  end
  if estimate + n <= l then
    if write then set_state(key, fmt(w) .. ':' .. fmt(prev) .. ':' .. fmt(cur + n), reset(cur + n)) end
    return reply(true, l, l - estimate - n, reset(cur + n), 0)
  end
  -- The least x in [from, P) with weight * (P - x) < (room + 1) * P, or nil.
  local function first_fit(weight, room, from)
    if weight == 0 then return from end
    local most = fdiv((room + 1) * p - 1, weight)
    local x = p - most
    if x < from then x = from end
    if x < p then return x end
    return nil
  end
  local retry_at
  if l - cur - n >= 0 then
    local x = first_fit(prev, l - cur - n, e)
    if x then retry_at = start + x end
  end
  if not retry_at then
    -- The next window: cur becomes prev and fades; else the one after, empty.
    local x = first_fit(cur, l - n, 0)
    if x then
      retry_at = start + p + x
    else
      retry_at = start + 2 * p
    end
  end
  return reply(false, l, l - estimate, reset(cur), retry_at - now)
end
