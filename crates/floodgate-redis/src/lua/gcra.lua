-- GCRA. Arguments: key, cost n, write, T (emission interval, us), B (burst).
-- State: the theoretical arrival time (TAT) in microseconds, a string; after a
-- charge with receipts "TAT:ledger:hi:floor:incarnation:records" (see
-- gcra_refund), which charges keep. The records are the receipts refunded
-- ("noted/end" each, see refund_ids), each one whose refund moved no later
-- booking followed by a note of it, "0/1/before/back" (see `lone_note`), after
-- the key's latest reading as a record of its own, "0/0/reading" (see
-- `reading_record`).

-- The key's latest reading: the largest server now an admission on it was judged
-- at (a denial writes nothing and needs none: it admits no later schedule), kept
-- by every write in the receipts form and read by a refund, which is judged no
-- earlier: a server time that stepped back (a clock step, a failover to a replica
-- whose clock is behind) then frees no schedule a later admission had passed.
-- Written as the first of the records, "0/0/reading": three numbers, a form no
-- GCRA receipt has, so it is never a receipt's id, and the state keeps the six
-- fields that a version without it reads. Such a version keeps the records as it
-- found them (its admissions do not raise the reading; its refunds are judged at
-- its now) and, once its own refunds push the records past what a key remembers,
-- drops the oldest, this one, raising a floor of 0 to 1 (the receipts charged at
-- ledger 0 and not yet refunded then give nothing back: a conservative loss), in
-- place of a receipt: after each of this version's admissions its next refund
-- keeps one receipt more than a key remembers, until this version's next refund
-- trims them back (`record_gcra_refund`). A
-- state without it (written before it, or by such a version) has no known
-- reading: its refund is judged at now, as before, and its next admission starts
-- one.
local function reading_record(reading, ids)
  if not reading then return ids end
  local record = '0/0/' .. fmt(reading)
  if ids == '' then return record end
  return record .. ',' .. ids
end

-- The state at `key`: nil when absent, else { tat, ledger, hi, floor, born, ids,
-- reading } (ids: the refund records after the reading, false in the plain form;
-- reading: false where none is known); or an error reply for a value no script
-- writes.
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
  local reading = false
  if ids then
    local r, tail = string.match(ids, '^0/0/(%d+)(.*)$')
    if r then
      if tail ~= '' then
        tail = string.match(tail, '^,(.+)$')
        if not tail then return nil, malformed(key, 'a latest reading that is not a record of its own') end
      end
      reading, ids = tonumber(r), tail
      if reading >= EXACT then return nil, malformed(key, 'a latest reading past 2^53') end
      -- An admission at reading r books past r, and the latest TAT is at least
      -- every TAT booked: a reading no earlier than it was written by no script.
      if reading >= h then return nil, malformed(key, 'a latest reading not before the latest TAT') end
    end
  end
  return { tat = s, ledger = l, hi = h, floor = f, born = b, ids = ids, reading = reading }
end

-- Writes TAT `tat`, an admission's at now, over the state `st` (nil: none): the
-- plain form while no charge with receipts was made, else the refund fields (those
-- of a new incarnation where the state had none, see `incarnation`) kept, the
-- latest reading raised to now (see `reading_record`) and the key alive until
-- `hi`, the latest TAT ever written, has passed (every receipt's booking ends by
-- then). Returns the state's incarnation and ledger.
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
  local reading = now
  if st.reading and st.reading > reading then reading = st.reading end
  set_state(key, fmt(tat) .. ':' .. fmt(st.ledger) .. ':' .. fmt(hi) .. ':' ..
    fmt(st.floor) .. ':' .. fmt(st.born) .. ':' .. reading_record(reading, st.ids), hi - now)
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

-- A refund that moved no later booking: its receipt's booking, moved down by the
-- whole shift it was given, still ended at the TAT it wrote over. The shift bounds
-- how far the booking moved, so it ended at or past that TAT, and no booking held
-- ends past the TAT (a later one raises it past its own end, and a refund lowers it
-- by what it gives back, the schedule above moving down with it): nothing was
-- booked after it, and a booking made later starts from the schedule it left. It
-- moved no booking then, and none later: an earlier booking lies below it, a later
-- one was placed after it. So it counts in no later refund's shift, as in process
-- (`Algorithm::refund_moves_later`, `RefundLedger` in floodgate's cell.rs). Its
-- schedule still counts in the ledger (every charge notes the whole ledger, so that
-- between two refunds that gave back every charge raises the TAT and receipt ids
-- stay unique); the record after its receipt's notes it: "0/1/before/back", the
-- ledger before it and what it gave back. Four numbers, a form no GCRA receipt id
-- (two) nor the reading (0/0/...) has. A version without notes (session 45 and
-- before) takes one for a receipt it never matches, counts it in the records it
-- keeps, and dropping it raises a floor of 0 to 1 at most (as the reading's, a
-- conservative loss); its own refunds write no note, and so count in every later
-- shift.
local function lone_note(record)
  local before, back = string.match(record, '^0/1/(%d+)/(%d+)$')
  if not before then return nil end
  return tonumber(before), tonumber(back)
end

-- What the refunds after the ledger stood at `noted` that moved no later booking
-- gave back, by the notes in `list` (the refund records), or nil and an error
-- reply for notes no script writes. Every note must lie within the ledger and
-- after the one before it (refunds are noted in ledger order, each adding what it
-- gave back, at least 1): those at or past `noted` are then disjoint parts of
-- `ledger - noted`, which the shift never falls below 0 by taking off. A note
-- forgotten (trimmed; by a version before it) only leaves its refund in the shift:
-- a bound still, giving back less.
local function lone_since(key, list, noted, ledger)
  local since, reach = 0, 0
  for i = 1, #list do
    local before, back = lone_note(list[i])
    if before then
      if before >= EXACT or back >= EXACT or back < 1 or before < reach or
        before + back > ledger then
        return nil, malformed(key, 'a note of a refund outside the ledger')
      end
      reach = before + back
      if before >= noted then since = since + back end
    end
  end
  return since
end

-- Records receipt `id` in `list` (and its note `note`, if any) and trims the
-- records to `kept` receipts, the oldest first, the floor past each one
-- dropped; a note goes with its receipt (a note left first, after a receipt a
-- version before it dropped, goes too). Returns the records as stored and the
-- floor.
local function record_gcra_refund(list, id, note, floor, kept)
  list[#list + 1] = id
  if note then list[#list + 1] = note end
  local receipts = 0
  for i = 1, #list do
    if not lone_note(list[i]) then receipts = receipts + 1 end
  end
  while #list > 0 and (receipts > kept or lone_note(list[1])) do
    local oldest = table.remove(list, 1)
    if not lone_note(oldest) then
      receipts = receipts - 1
      local noted = tonumber(string.match(oldest, '^(%d+)/'))
      if noted + 1 > floor then floor = noted + 1 end
    end
  end
  return table.concat(list, ','), floor
end

-- How many receipts a key of burst `b` remembers: its burst, at least REFUNDS_KEPT
-- and at most REFUNDS_KEPT_WIDE. A crowd charged before any of its refunds notes
-- one ledger; at most the burst of it was admitted at once.
local function gcra_kept(b)
  if b < REFUNDS_KEPT then return REFUNDS_KEPT end
  if b > REFUNDS_KEPT_WIDE then return REFUNDS_KEPT_WIDE end
  return b
end

-- Gives back the part of a charge's booking [start, e) still ahead of the reading
-- it is judged at, as the in-process GCRA refund: the refunds made since the
-- charge (the ledger, the sum of all schedule given back, less `noted`, the
-- ledger the charge saw, less what the noted refunds since that moved no later
-- booking gave back, see `lone_note`) may have moved the booking down by at most
-- that `shift`; units booked after it and still ahead of that reading + B*T stay
-- spent. Judged at max(now, the key's latest reading): a server time behind an
-- admission's reading would give back schedule that admission had passed (the TAT
-- then falls below its reading and the burst admits again what it already
-- admitted); at the latest reading, the TAT left is never below it. A state of no
-- known reading is judged at now. Each refund is recorded by its receipt's id
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
  local lone, bad_note = lone_since(key, ids, noted, st.ledger)
  if bad_note then return bad_note end
  -- Another incarnation of the key (this one was lost and created again) holds
  -- none of the charge's units.
  if st.born ~= born then return 0 end
  local id = fmt(noted) .. '/' .. fmt(e)
  if not refundable(ids, id, noted, st.ledger, st.floor) then return 0 end
  local at = now
  if st.reading and st.reading > at then at = st.reading end
  local shift = st.ledger - noted - lone
  local s0 = start - shift
  if s0 < 0 then s0 = 0 end
  local e0 = e - shift
  if e0 < 0 then e0 = 0 end
  if at > s0 then s0 = at end
  local own = e0 - s0
  if own <= 0 then return 0 end
  local passed = at + b * t - shift
  if passed < e0 then passed = e0 end
  local ahead = st.tat - passed
  if ahead < 0 then ahead = 0 end
  local back = own - ahead
  if back <= 0 then return 0 end
  -- A ledger past 2^53 would leave the key malformed for every later call: such a
  -- refund gives nothing (a conservative loss, as the floor's).
  if st.ledger + back >= EXACT then return 0 end
  -- Nothing booked after it (`lone_note`): noted, and left out of later shifts.
  local note = false
  if st.tat <= e0 then note = '0/1/' .. fmt(st.ledger) .. '/' .. fmt(back) end
  return back, function()
    local tat = st.tat - back
    if tat < 0 then tat = 0 end
    local kept, floor = record_gcra_refund(ids, id, note, st.floor, gcra_kept(b))
    -- The latest reading kept (a refund admits nothing), the key alive as long.
    set_state(key, fmt(tat) .. ':' .. fmt(st.ledger + back) .. ':' .. fmt(st.hi) .. ':' ..
      fmt(floor) .. ':' .. fmt(st.born) .. ':' .. reading_record(st.reading, kept), st.hi - now)
  end
end
