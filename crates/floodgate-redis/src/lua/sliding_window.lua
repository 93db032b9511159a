-- Sliding window counter. Arguments: key, cost n, write, P (period, us), L (limit).
-- State: "window:prev:cur:P" (prev = the count of window - 1).
local function sliding_window(key, n, write, p, l)
  local w = fdiv(now, p)
  local prev, cur = 0, 0
  local stored = redis.call('GET', key)
  if stored then
    local sw, sp, sc, speriod = string.match(stored, '^(%d+):(%d+):(%d+):(%d+)$')
    sw, sp, sc, speriod = tonumber(sw), tonumber(sp), tonumber(sc), tonumber(speriod)
    if not sw or not sp or not sc or not speriod then
      return malformed(key, 'not window:prev:cur:period')
    end
    -- Never back to an older window: an earlier reading is judged at the start of
    -- the stored one. Windows of another period count other windows (read on
    -- their own period): what their estimate still counts now counts in this
    -- window, since both policies may be in force at once (a rolling deploy), and
    -- starting fresh on each switch would let callers spread over both go
    -- unlimited.
    if speriod == p and sw >= w then
      w, prev, cur = sw, sp, sc
    elseif speriod == p and sw == w - 1 then
      prev = sc
    elseif speriod ~= p then
      local ow = fdiv(now, speriod)
      if sw >= ow then
        local oe = now - sw * speriod
        if oe < 0 then oe = 0 end
        cur = fdiv(sp * (speriod - oe), speriod) + sc
      elseif sw == ow - 1 then
        cur = fdiv(sc * (speriod - (now - ow * speriod)), speriod)
      end
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
    if write then
      local state = fmt(w) .. ':' .. fmt(prev) .. ':' .. fmt(cur + n) .. ':' .. fmt(p)
      set_state(key, state, reset(cur + n))
    end
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
