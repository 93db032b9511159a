-- Sliding window counter. Arguments: key, cost n, write, P (period, us), L (limit).
-- State: "window:prev:cur:P" (prev = the count of window - 1); after a charge
-- with receipts "window:prev:cur:P:ledger:floor:incarnation:ids" (see
-- window_refund_fields and sliding_window_refund), which every later write keeps;
-- and last, with the latest reading, "...@reading" (see window_reading).
local function sliding_window(key, n, write, p, l)
  -- The instant judged: now, or later where now is behind the state (judged_at).
  local at = now
  local reading = -1
  local w = fdiv(at, p)
  local prev, cur = 0, 0
  local keep = 0
  -- The refund fields, kept as they are: '' before any charge with receipts.
  local refunds = ''
  local ledger = 0
  local born = 0
  local stored = redis.call('GET', key)
  if stored then
    local sw, sp, sc, speriod, rest = string.match(stored, '^(%d+):(%d+):(%d+):(%d+)(.*)$')
    if rest then
      rest, reading = window_reading(key, rest)
      if not rest then return reading end
      refunds, ledger, born = window_refund_fields(key, rest)
      if not refunds then return ledger end
    end
    sw, sp, sc, speriod = tonumber(sw), tonumber(sp), tonumber(sc), tonumber(speriod)
    if not sw or not sp or not sc or not speriod then
      return malformed(key, 'not window:prev:cur:period')
    end
    if speriod == 0 then return malformed(key, 'period 0') end
    if (sw + 1) * speriod >= EXACT then return malformed(key, 'window ends past 2^53 us') end
    at = judged_at(reading, sw, speriod)
    if not at then return malformed(key, 'window starts past 2^52 us') end
    w = fdiv(at, p)
    -- Never back to an older window: an earlier reading is judged at the start of
    -- the stored one. Windows of another period count other windows (read on
    -- their own period): both policies may be in force at once (a rolling deploy),
    -- and starting fresh on each switch would let callers spread over both go
    -- unlimited. Its previous window's units were all admitted before that
    -- window's end, its current window's before its own end: each count goes
    -- whole into this window if its end is past this window's start, into the
    -- previous one (weighted) if past that one's start (never fewer than the
    -- windows hold). Units admitted now count for that period until the end of
    -- its next window. Judged at the latest reading (or the stored window's
    -- start) where now is behind it (as the fixed window: no unit of the state is
    -- in a later window than counts it).
    if speriod == p and sw >= w then
      w, prev, cur = sw, sp, sc
    elseif speriod == p and sw == w - 1 then
      prev = sc
    elseif speriod ~= p then
      refunds, ledger = window_fields_after_switch(refunds, ledger, born)
      local here = w * p
      for _, part in ipairs({ { sp, sw * speriod }, { sc, (sw + 1) * speriod } }) do
        if part[2] > here then
          cur = cur + part[1]
        elseif part[2] > here - p then
          prev = prev + part[1]
        end
      end
      -- A previous count above this limit counts whole: prev * (P - e) stays
      -- below 2^53, and nothing here is more permissive than the weighted count.
      if prev > l then cur, prev = cur + prev, 0 end
      -- Nor fewer than the other policy's own estimate now (it weighs its previous
      -- window over its own period): at a switch a unit fits only where it fits
      -- under both.
      local ow = fdiv(at, speriod)
      local other = 0
      if sw >= ow then
        -- at >= sw * speriod (judged_at): oe >= 0.
        local oe = at - sw * speriod
        other = fdiv(sp * (speriod - oe), speriod) + sc
      elseif sw == ow - 1 then
        other = fdiv(sc * (speriod - (at - ow * speriod)), speriod)
      end
      local e = at - here
      local mine = fdiv(prev * (p - e), p) + cur
      if other > mine then cur = cur + other - mine end
      keep = (fdiv(at, speriod) + 2) * speriod - now
    end
  end
  if not stored then refunds, ledger, born = window_refund_fields(key, '') end
  -- w is at's window (or the stored one, which is at's: judged_at), so e >= 0.
  local start = w * p
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
      local state = fmt(w) .. ':' .. fmt(prev) .. ':' .. fmt(cur + n) .. ':' .. fmt(p) .. refunds ..
        reading_field(reading, at)
      set_window_state(key, state, reset(cur + n), keep)
      -- The window, the current count after the charge, the ledger it saw, the cost,
      -- the key's incarnation.
      RECEIPT = { w, cur + n, ledger, n, born }
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

-- The sliding window's refund: the current count (field 3 of 4), as
-- `window_refund` says; the previous window's count is never touched.
local function sliding_window_refund(key, cw, after, noted, n, born, p)
  return window_refund(key, 4, 3, cw, after, noted, n, born, p)
end
