-- GCRA. Arguments: key, cost n, write, T (emission interval, us), B (burst).
-- State: the theoretical arrival time (TAT) in microseconds, a string; after a
-- charge with receipts "TAT:ledger:hi:floor:incarnation:ids" (see gcra_refund),
-- which charges keep.

-- The state at `key`: nil when absent, else { tat, ledger, hi, floor, born, ids }; or an
-- error reply for a value no script writes.
local function gcra_read(key)
  local stored = redis.call('GET', key)
  if not stored then return nil end
  local s, l, h, f, b, ids = stored, '0', stored, '0', '0', false
  if not string.match(stored, '^%d+$') then
    s, l, h, f, b, ids = string.match(stored, '^(%d+):(%d+):(%d+):(%d+):(%d+):([%d/,]*)$')
    if not s then return nil, malformed(key, 'not a whole number below 2^53') end
  end
  s, l, h, f, b = tonumber(s), tonumber(l), tonumber(h), tonumber(f), tonumber(b)
  if not s or s >= EXACT or l >= EXACT or h >= EXACT or f >= EXACT or b >= EXACT then
    return nil, malformed(key, 'not a whole number below 2^53')
  end
  -- Every write keeps the latest TAT at least the TAT; the key lives until it.
  if h < s then return nil, malformed(key, 'a latest TAT below the TAT') end
  return { tat = s, ledger = l, hi = h, floor = f, born = b, ids = ids }
end

-- Writes TAT `tat` over the state `st` (nil: none): the plain form while no
-- charge with receipts was made, else the refund fields (those of a new
-- incarnation where the state had none, see `incarnation`) kept and the key alive
-- until `hi`, the latest TAT ever written, has passed (every receipt's booking
-- ends by then). Returns the state's incarnation and ledger.
local function gcra_write(key, st, tat)
  if (not st or not st.ids) and not ISSUING then
    set_state(key, fmt(tat), tat - now)
    return 0, 0
  end
  if not st or not st.ids then
    local old = st and st.tat or tat
    st = { ledger = 0, hi = old, floor = 0, born = incarnation(), ids = '' }
  end
  local hi = st.hi
  if tat > hi then hi = tat end
  set_state(key, fmt(tat) .. ':' .. fmt(st.ledger) .. ':' .. fmt(hi) .. ':' ..
    fmt(st.floor) .. ':' .. fmt(st.born) .. ':' .. st.ids, hi - now)
  return st.born, st.ledger
end

local function gcra(key, n, write, t, b)
  local st, err = gcra_read(key)
  if err then return err end
  local tat = now
  -- A server clock that reads earlier never moves the state back: tat = max(TAT, now).
  if st and st.tat > tat then tat = st.tat end
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
    if write then
      local born, ledger = gcra_write(key, st, new_tat)
      -- The charge's booking [tat, new_tat), the refund ledger it saw, the key's
      -- incarnation.
      RECEIPT = { tat, new_tat, ledger, born }
    end
    return reply(true, b, remaining_at(new_tat), new_tat - now, 0)
  end
  return reply(false, b, remaining_at(tat), tat - now, new_tat - limit_at)
end

-- Gives back the part of a charge's booking [start, e) still ahead of now, as the
-- in-process GCRA refund: the refunds made since the charge (the ledger, the sum
-- of all schedule given back, less `noted`, the ledger the charge saw) may have
-- moved the booking down by at most that `shift`; units booked after it and still
-- ahead of now + B*T stay spent. Each refund is recorded by its receipt's id
-- (noted/e, unique on the key: between two refunds every charge raises the TAT),
-- so a receipt refunds once however often it is sent. Returns the microseconds of
-- schedule given back (0: nothing) and the function that writes it back (none for
-- 0), or an error reply: the key is read and checked once, written nothing until
-- that function runs, which writes from what was read.
local function gcra_refund(key, start, e, noted, born, t, b)
  local st, err = gcra_read(key)
  if err then return err end
  if not st then return 0 end
  local ids, bad = refund_ids(key, st.ids)
  if bad then return bad end
  -- Another incarnation of the key (this one was lost and created again) holds
  -- none of the charge's units.
  if st.born ~= born then return 0 end
  local id = fmt(noted) .. '/' .. fmt(e)
  if not refundable(ids, id, noted, st.ledger, st.floor) then return 0 end
  local shift = st.ledger - noted
  local s0 = start - shift
  if s0 < 0 then s0 = 0 end
  local e0 = e - shift
  if e0 < 0 then e0 = 0 end
  if now > s0 then s0 = now end
  local own = e0 - s0
  if own <= 0 then return 0 end
  local passed = now + b * t - shift
  if passed < e0 then passed = e0 end
  local ahead = st.tat - passed
  if ahead < 0 then ahead = 0 end
  local back = own - ahead
  if back <= 0 then return 0 end
  -- A ledger past 2^53 would leave the key malformed for every later call: such a
  -- refund gives nothing (a conservative loss, as the floor's).
  if st.ledger + back >= EXACT then return 0 end
  return back, function()
    local tat = st.tat - back
    if tat < 0 then tat = 0 end
    local kept, floor = record_refund(ids, id, st.floor)
    set_state(key, fmt(tat) .. ':' .. fmt(st.ledger + back) .. ':' .. fmt(st.hi) .. ':' ..
      fmt(floor) .. ':' .. fmt(st.born) .. ':' .. kept, st.hi - now)
  end
end
