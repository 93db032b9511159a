-- Fixed window. Arguments: key, cost n, write, P (period, us), L (limit).
-- State: "window:count:P", window = floor(now / P); after a charge with receipts
-- "window:count:P:ledger:floor:incarnation:ids" (see window_refund_fields and
-- fixed_window_refund), which every later write keeps, in any window and under
-- any period, while the key lives; and last, with the latest reading,
-- "...@reading" (see window_reading).
local function fixed_window(key, n, write, p, l)
  -- The instant judged: now, or later where now is behind the state (judged_at).
  local at = now
  local reading = -1
  local w = fdiv(at, p)
  local count = 0
  local keep = 0
  -- The refund fields, kept as they are: '' before any charge with receipts.
  local refunds = ''
  local ledger = 0
  local born = 0
  local stored = redis.call('GET', key)
  if stored then
    local sw, sc, sp, rest = string.match(stored, '^(%d+):(%d+):(%d+)(.*)$')
    if rest then
      rest, reading = window_reading(key, rest)
      if not rest then return reading end
      refunds, ledger, born = window_refund_fields(key, rest)
      if not refunds then return ledger end
    end
    sw, sc, sp = tonumber(sw), tonumber(sc), tonumber(sp)
    if not sw or not sc or not sp then return malformed(key, 'not window:count:period') end
    if sp == 0 then return malformed(key, 'period 0') end
    if (sw + 1) * sp >= EXACT then return malformed(key, 'window ends past 2^53 us') end
    at = judged_at(reading, sw, sp)
    if not at then return malformed(key, 'window starts past 2^52 us') end
    w = fdiv(at, p)
    -- A window state never goes back to an older window. One of another period
    -- counts other windows (its index is read on its own period, never on this
    -- one): both policies may be in force at once (a rolling deploy), and starting
    -- fresh on each switch would let callers spread over both go unlimited. Its
    -- units were all admitted before its window's end: while that end is past this
    -- window's start they count here, whole (never fewer than this window holds).
    -- Units admitted now count for that period until its window ends. Judged at
    -- the latest reading (or the stored window's start) where now is behind it:
    -- every unit of the state was admitted at or before the latest reading, so
    -- none of them is in a later window of this period than the one counting
    -- them (a reading behind, on a replica's clock, would count them in an
    -- earlier window, which forgets them sooner).
    if sp == p and sw >= w then
      w = sw
      count = sc
    elseif sp ~= p then
      refunds, ledger = window_fields_after_switch(refunds, ledger, born)
      if (sw + 1) * sp > w * p then count = sc end
      keep = (fdiv(at, sp) + 1) * sp - now
    end
  end
  if not stored then refunds, ledger, born = window_refund_fields(key, '') end
  local reset = (w + 1) * p - now
  if n > l then
    return reply(false, l, l - count, reset, -1)
  end
  if n == 0 then
    return reply(true, l, l - count, reset, 0)
  end
  if count + n <= l then
    if write then
      set_window_state(key, fmt(w) .. ':' .. fmt(count + n) .. ':' .. fmt(p) .. refunds ..
        reading_field(reading, at), reset, keep)
      -- The window, the count after the charge, the ledger it saw, the cost, the
      -- key's incarnation.
      RECEIPT = { w, count + n, ledger, n, born }
    end
    return reply(true, l, l - count - n, reset, 0)
  end
  return reply(false, l, l - count, reset, reset)
end

-- The fixed window's refund: the count (field 2 of 3), as `window_refund` says.
local function fixed_window_refund(key, cw, after, noted, n, born, p)
  return window_refund(key, 3, 2, cw, after, noted, n, born, p)
end
