-- floodgate: helpers shared by every transition.
-- Every number here is an integer below 2^53, where Lua's doubles are exact;
-- the Rust side rejects the policies that could leave that range.

-- floor(a / b) for integers a, b (b > 0) below 2^53: the quotient of two doubles
-- is off by at most one unit from the true one, and one step corrects it.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- An integer as Redis stores it: every digit, no exponent.
local function fmt(x)
  return string.format('%.0f', x)
end

-- A reply: allowed (0 or 1), limit, remaining, reset_after and retry_after in
-- microseconds; retry_after -1 means never.
local function reply(allowed, limit, remaining, reset, retry)
  if remaining < 0 then remaining = 0 end
  if remaining > limit then remaining = limit end
  return { allowed and 1 or 0, limit, remaining, reset, retry }
end

-- The time-to-live of a key whose state is back to fresh in `us` microseconds:
-- whole milliseconds rounded up, at least one. `false` when keys get none.
local function ttl_ms(us)
  if not EXPIRE then return false end
  local ms = fdiv(us + 999, 1000)
  if ms < 1 then ms = 1 end
  return ms
end

local function set_state(key, value, reset_us)
  local ms = ttl_ms(reset_us)
  if ms then
    redis.call('SET', key, value, 'PX', fmt(ms))
  else
    redis.call('SET', key, value)
  end
end

-- set_state for a window state, which may hold units that a policy of another
-- period (a rolling deploy runs both on the same keys) still counts after its own
-- period forgets them: the key lives at least `keep_us` microseconds (and a
-- millisecond more, for a later write's rounding), and a write keeps a time to live
-- longer than its own by more than that rounding (another period's).
local function set_window_state(key, value, reset_us, keep_us)
  local ms = ttl_ms(reset_us)
  if ms then
    if keep_us > reset_us then ms = ttl_ms(keep_us) + 1 end
    local left = redis.call('PTTL', key)
    if left > ms + 1 then ms = left end
    redis.call('SET', key, value, 'PX', fmt(ms))
  else
    redis.call('SET', key, value)
  end
end

-- 2^53 us: no state a script writes holds a time (a TAT, a window's end, a logged
-- instant) this late — a time is at most 2^52 and a span at most 2^51 — so one that
-- does was written by someone else, and the sums on it would leave the exact range.
local EXACT = 9007199254740992

-- What a charge took, for a refund (set by a transition that wrote; see the
-- charge drivers in script.rs): the numbers a refund of the algorithm needs.
local RECEIPT = false

-- Whether this run charges with receipts (set by the charge drivers): its writes
-- over another period's window state then reset the refund fields.
local ISSUING = false

local function malformed(key, what)
  return redis.error_reply('floodgate: malformed state at key ' .. key .. ': ' .. what)
end

-- Refund records: the ids of the receipts refunded on a key, "noted/..." each
-- (noted: the key's refund ledger when the receipt's charge was made), comma-
-- separated, the oldest first. A list of them, or nil and an error reply.
local function refund_ids(key, ids)
  local list = {}
  if not ids or ids == '' then return list end
  for x in string.gmatch(ids .. ',', '([^,]*),') do
    if not string.match(x, '^%d+/%d+[%d/]*$') then
      return nil, malformed(key, 'a refund record is not noted/...')
    end
    list[#list + 1] = x
  end
  return list
end

-- How many refunds a sliding log remembers beyond those it prunes (see
-- `sliding_log_refund`): a receipt whose ledger is below the floor (it was
-- charged before every refund remembered) gives back nothing. 8 for the log, whose
-- versions before session 47 refuse a key of more refund members as malformed
-- (LOG_REFUNDS_READ below: what this version reads).
local REFUNDS_KEPT = 8

-- How many refunds of its current window a window state remembers, and how many
-- receipts a GCRA key of burst 64 or more (at least 8, at most its burst, below):
-- a crowd of one key charged before any of its refunds notes one ledger, and
-- forgetting one of its refunds raises the floor past every other; as many
-- charges as a limit admits at once (up to this many) all give back. The
-- previous versions read any number of records and trim them to 8 on their own
-- refunds (raising the floor: a conservative loss).
local REFUNDS_KEPT_WIDE = 64

-- How many refund records a sliding log's reader accepts (`log_refunds`), apart
-- from how many its writer keeps (REFUNDS_KEPT): step 1 of two of a rolling
-- deploy. Raising what the log keeps in one release would let a node still
-- running the previous script meet a key of more records than it reads, and
-- call it malformed. So this version reads up to REFUNDS_KEPT_WIDE records (a
-- key holds them and its head and logged members, so up to this many + 2 members
-- at -inf) and still writes at most REFUNDS_KEPT: on a key of more, its refund
-- trims them to REFUNDS_KEPT and raises the floor past those forgotten (a
-- conservative loss, as the windows' previous versions). Step 2, once no node
-- runs a version before this one (the builder's `wide_log_refunds`, WIDE_LOG in
-- the prologue, session 54): the log's refund keeps REFUNDS_KEPT_WIDE records
-- (record_refund's `kept`), so a crowd of more than 8 charged at one instant gets
-- all its refunds; nothing else changes.
local LOG_REFUNDS_READ = REFUNDS_KEPT_WIDE

-- Whether receipt `id` charged at ledger `noted` may still refund, against the
-- state's ledger, floor and records.
local function refundable(list, id, noted, ledger, floor)
  if noted > ledger or noted < floor then return false end
  for i = 1, #list do
    if list[i] == id then return false end
  end
  return true
end

-- Records `id` in `list`; returns the records as stored and the floor, raised
-- past each oldest one forgotten. The list comes back to `kept` (REFUNDS_KEPT
-- when nil) however long it was found (the windows' and the log's; GCRA trims its own records with their
-- notes, `record_gcra_refund` in gcra.lua, which comes back the same way: a key of
-- a version without the latest reading may hold more, that version taking the
-- reading for a receipt of its own and dropping it in a receipt's place).
local function record_refund(list, id, floor, kept)
  list[#list + 1] = id
  while #list > (kept or REFUNDS_KEPT) do
    local oldest = tonumber(string.match(table.remove(list, 1), '^(%d+)/'))
    if oldest + 1 > floor then floor = oldest + 1 end
  end
  return table.concat(list, ','), floor
end

-- A key's incarnation for its receipts: the server time (+1, never 0) of the
-- first charge with receipts on it, kept by every later write while the key lives.
-- A key lost (evicted, a write lost in a failover) and created again gets another
-- one, so a receipt of the lost key refunds nothing on its successor; a state of
-- no refund fields is incarnation 0, which no receipt names.
local function incarnation()
  return now + 1
end

-- The refund fields after a window state's numbers: `rest` is '' (no refund
-- fields) or ":ledger:floor:incarnation:ids". Returns the fields to write (those
-- of an incarnation of its own when this run issues receipts on a state without
-- them), the ledger and the incarnation; or nil and an error reply.
local function window_refund_fields(key, rest)
  if rest == '' then
    if ISSUING then
      local born = incarnation()
      return ':0:0:' .. fmt(born) .. ':', 0, born
    end
    return '', 0, 0
  end
  local ledger, floor, born = string.match(rest, '^:(%d+):(%d+):(%d+):[%d/,]*$')
  if not ledger or tonumber(ledger) >= EXACT or tonumber(floor) >= EXACT or
    tonumber(born) >= EXACT then
    return nil, malformed(key, 'not a window state with refund fields')
  end
  return rest, tonumber(ledger), tonumber(born)
end

-- A window state's latest reading: the server time (us) of the latest admission
-- written on it, after its other fields as "@reading" (the crate docs, "A policy
-- change": a reading behind it is judged at it). Written where READINGS is on (the
-- prologue: the limiter's `latest_reading` option) or the state had one, so a key
-- of a limiter without the option keeps the form an older version reads. A
-- reading is a time, at most 2^52 as `now` is (so the windows' sums on it stay
-- exact). Returns the fields before it and the reading (-1: none; a field "@0",
-- a charge at instant 0 through the replay calls, is one), or nil and an error
-- reply.
local function window_reading(key, rest)
  if not string.find(rest, '@', 1, true) then return rest, -1 end
  local fields, r = string.match(rest, '^([^@]*)@(%d+)$')
  r = tonumber(r)
  if not fields or not r or r > EXACT / 2 then
    return nil, malformed(key, 'not a window state with a latest reading')
  end
  return fields, r
end

-- The instant a window transition judges a state of window `sw` of period `sp`
-- with latest reading `r` (-1: none) at: now, or later where now is behind the
-- reading or the window's start (an admission judged in that window wrote the
-- state: a window index is first written from an instant in it, and kept by
-- later writes and refunds; its units may be older — a sliding window's previous
-- count, units carried over from another period — but judging there counts each
-- of them in no earlier window than judging at now would: none forgotten sooner).
-- Nil where the window starts past 2^52 (no script's time is later: the state is
-- malformed).
local function judged_at(r, sw, sp)
  local start = sw * sp
  if start > EXACT / 2 then return nil end
  local at = now
  if r > at then at = r end
  if start > at then at = start end
  return at
end

-- The "@reading" a window write appends (see window_reading): `at`, the instant
-- the write was judged at (never before the state's reading `r`), where READINGS
-- is on or the state had one.
local function reading_field(r, at)
  if not READINGS and r < 0 then return '' end
  return '@' .. fmt(at)
end

-- The refund fields of a window state written over one of another period (a
-- rolling deploy): its count was rebuilt from the other period's, which may have
-- dropped the units of a receipt charged before (its own windows ended) while the
-- state comes back to that receipt's window and period, its count then made of
-- other charges. The ledger moves on by one and the floor to it: every receipt
-- charged before refunds nothing (a conservative loss), and none of them shares an
-- id with a charge after. Done where the state has refund fields (a run that
-- issues receipts gives a state without them its own, see window_refund_fields),
-- so a key of no refund keeps the form an older version reads. Returns the fields
-- and the ledger.
local function window_fields_after_switch(refunds, ledger, born)
  if refunds == '' then return refunds, ledger end
  if ledger + 1 < EXACT then ledger = ledger + 1 end
  return ':' .. fmt(ledger) .. ':' .. fmt(ledger) .. ':' .. fmt(born) .. ':', ledger
end

-- The records of `list` (a window state's, "noted/P/window/after" each) that a
-- receipt may still match, for a refund in window `cw` of period `p` (the state's):
-- those of that period and of no older window. The others are forgotten without
-- raising the floor: their receipts give back nothing again in any case, as
-- `window_refund` gives back only while the state holds the receipt's window and
-- period, a window state never goes back to an older window of its period (every
-- version's charges keep the later one), and a write under another period raises
-- the floor past every receipt charged before it and drops the records
-- (`window_fields_after_switch`), so a record of another period is none a
-- script wrote.
local function window_records(list, cw, p)
  local live = {}
  for i = 1, #list do
    local rp, rw = string.match(list[i], '^%d+/(%d+)/(%d+)/%d+$')
    if rp and tonumber(rp) == p and tonumber(rw) >= cw then live[#live + 1] = list[i] end
  end
  return live
end

-- Gives back the units of a charge of `n` counted in field `at` of a window state
-- of `width` numbers (the window first, the period last) at `key`, charged in
-- window `cw` of period `p` (the count after it `after`, the ledger it saw
-- `noted`) in incarnation `born`, as the in-process windows do: only while the
-- state is still that window of this period and that incarnation of the key (once
-- a later decision moved it on, the count given back is one no decision reads
-- again), at most `n`, never below 0. Once per receipt: the ledger
-- (units given back on the key), the floor and the records. Returns the units
-- given back and the function that writes them back (none for 0), or an error
-- reply: the key is read and checked once, written nothing until that function
-- runs, which writes from what was read.
local function window_refund(key, width, at, cw, after, noted, n, born, p)
  local stored = redis.call('GET', key)
  if not stored then return 0 end
  local nums, rest = {}, stored
  for i = 1, width do
    local x
    x, rest = string.match(rest, i == 1 and '^(%d+)(.*)$' or '^:(%d+)(.*)$')
    if not x or tonumber(x) >= EXACT then return malformed(key, 'not a window state') end
    nums[i] = tonumber(x)
  end
  local reading = ''
  local fields, r = window_reading(key, rest)
  if not fields then return r end
  -- Any reading, 0 included (a charge at instant 0 writes "@0"), kept as found.
  if r >= 0 then rest, reading = fields, '@' .. fmt(r) end
  local ledger, floor, incarnation_here, ids = 0, 0, 0, ''
  if rest ~= '' then
    ledger, floor, incarnation_here, ids = string.match(rest, '^:(%d+):(%d+):(%d+):([%d/,]*)$')
    if not ledger then return malformed(key, 'not a window state with refund fields') end
    ledger, floor, incarnation_here = tonumber(ledger), tonumber(floor), tonumber(incarnation_here)
    if ledger >= EXACT or floor >= EXACT or incarnation_here >= EXACT then
      return malformed(key, 'a number past 2^53')
    end
  end
  local list, bad = refund_ids(key, ids)
  if bad then return bad end
  if nums[width] ~= p or nums[1] ~= cw or incarnation_here ~= born then return 0 end
  local id = fmt(noted) .. '/' .. fmt(p) .. '/' .. fmt(cw) .. '/' .. fmt(after)
  if not refundable(list, id, noted, ledger, floor) then return 0 end
  local back = n
  if nums[at] < back then back = nums[at] end
  if back <= 0 then return 0 end
  -- A ledger past 2^53 would leave the key malformed for every later call: such a
  -- refund gives nothing (a conservative loss, as the floor's).
  if ledger + back >= EXACT then return 0 end
  return back, function()
    nums[at] = nums[at] - back
    local kept, new_floor = record_refund(window_records(list, cw, p), id, floor,
      REFUNDS_KEPT_WIDE)
    for i = 1, width do nums[i] = fmt(nums[i]) end
    local value = table.concat(nums, ':') .. ':' .. fmt(ledger + back) .. ':' ..
      fmt(new_floor) .. ':' .. fmt(born) .. ':' .. kept .. reading
    -- The key's time to live as it was (it may be another period's, longer).
    local left = EXPIRE and redis.call('PTTL', key) or -1
    if left > 0 then
      redis.call('SET', key, value, 'PX', left)
    else
      redis.call('SET', key, value)
    end
  end
end

-- Past 2^52 us (the year 2112) the sums below could leave the exact range.
if now ~= now or now < 0 or now > 4503599627370496 then
  return redis.error_reply('floodgate: time ' .. tostring(now) .. ' us is beyond the exact range')
end
