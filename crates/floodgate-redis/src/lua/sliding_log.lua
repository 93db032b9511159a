-- Sliding log. Arguments: key, cost n, write, P (period, us), L (limit).
-- State: a sorted set; one member per instant with admitted units, scored by the
-- instant (us), named "instant:units:total", where total counts the units of this
-- member and of every older one since the log began. A unit at x counts while
-- now < x + P. The units in the window are the newest total less the total before
-- the oldest live member, so a decision reads a few members, not the whole
-- window: O(log² n) for n members (all of them only when the totals pass 2^52,
-- once per 2^51 units admitted at the least).
-- After a charge with receipts, the refund members (see log_refunds and
-- sliding_log_refund), all scored -inf: "refunds:ledger:floor:incarnation"; once
-- a refund moved it past 0, "refunds:logged:instant"; and one "refunds:id:
-- noted/x/total" per receipt the key remembers (a refund writes at most
-- REFUNDS_KEPT, REFUNDS_KEPT_WIDE where WIDE_LOG is on; a reader accepts up to
-- LOG_REFUNDS_READ, common.lua: step 1 of raising what the log keeps, WIDE_LOG
-- step 2 writing that many). Each is
-- at most 61 bytes (every number below 2^53, 16 digits at most), within Redis's
-- default zset-max-listpack-value of 64: a refunded key stays a listpack.
-- Scored -inf, they come before every log member (ranks counted from -inf count
-- them among the members before any window), are never the newest member while
-- another is left, never live (no reading's window reaches -inf), and are dropped
-- by nothing but a write that renumbers (which puts them back) and the key's end:
-- every read of the members above stays exact. Every later write keeps them,
-- under any period, while the key lives.

-- A log member and its score as found ({ member, score }): { at, units, total, name };
-- nil when there is none (or it is a refund member, scored -inf: log_refunds
-- checked them all), false when it is malformed.
local function log_member(found)
  if not found[1] or found[2] == '-inf' then return nil end
  local u, t = string.match(found[1], '^%d+:(%d+):(%d+)$')
  local s = tonumber(found[2])
  u, t = tonumber(u), tonumber(t)
  -- A member holds no more units than its running total; that total (the script
  -- counts again past 2^52) and its instant are below 2^53, where sums are exact.
  if not s or not u or not t or u > t or t >= EXACT or s >= EXACT then return false end
  return { at = s, units = u, total = t, name = found[1] }
end

-- The refund members of the log at `key`: nil when there is none (a key never
-- charged with receipts: exactly the members above), else { names (every refund
-- member), head (its name), ledger, floor, born (the incarnation), logged (the
-- latest instant a unit was logged at, as far as a refund removed it: a reading
-- is judged no earlier; 0 without its member), logged_name (nil without it), ids
-- (the receipts remembered, "noted/x/total" each, the lowest noted first, as
-- refundable and record_refund take them) }; or nil and an error reply. Every
-- member at -inf must be one of them, once each, and a "refunds:" member at rank
-- 0 is at -inf. At most LOG_REFUNDS_READ records (more than any version writes:
-- this one writes REFUNDS_KEPT, a later one may write LOG_REFUNDS_READ), so at
-- most that many + 2 members at -inf (with the head and the logged member).
local function log_refunds(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if not first[1] then return nil end
  if first[2] ~= '-inf' then
    if string.sub(first[1], 1, 8) == 'refunds:' then
      return nil, malformed(key, 'a refund member not at -inf')
    end
    return nil
  end
  local found = redis.call('ZRANGEBYSCORE', key, '-inf', '-inf', 'LIMIT', 0,
    LOG_REFUNDS_READ + 3)
  local function bad(what)
    return nil, malformed(key, 'a member at -inf is not ' .. what)
  end
  if #found > LOG_REFUNDS_READ + 2 then return bad('one of the refund members (too many)') end
  local r = { names = found, logged = 0, ids = {} }
  local sort = {}
  for _, m in ipairs(found) do
    local l, f, b = string.match(m, '^refunds:(%d+):(%d+):(%d+)$')
    local g = string.match(m, '^refunds:logged:(%d+)$')
    local nt, x, t = string.match(m, '^refunds:id:(%d+)/(%d+)/(%d+)$')
    if l then
      l, f, b = tonumber(l), tonumber(f), tonumber(b)
      if r.head or l >= EXACT or f >= EXACT or b >= EXACT then
        return bad('one refunds:ledger:floor:incarnation')
      end
      r.head, r.ledger, r.floor, r.born = m, l, f, b
    elseif g then
      g = tonumber(g)
      if r.logged_name or g >= EXACT then return bad('one refunds:logged:instant') end
      r.logged_name, r.logged = m, g
    elseif nt then
      nt, x, t = tonumber(nt), tonumber(x), tonumber(t)
      local id = fmt(nt) .. '/' .. fmt(x) .. '/' .. fmt(t)
      -- As a refund writes it (refundable compares the text).
      if nt >= EXACT or x >= EXACT or t >= EXACT or string.sub(m, 12) ~= id then
        return bad('refunds:id:noted/x/total')
      end
      sort[#sort + 1] = { nt, x, t, id }
    else
      return bad('a refund member')
    end
  end
  if not r.head then return bad('with refunds:ledger:floor:incarnation') end
  if #sort > LOG_REFUNDS_READ then return bad('one of the refund members (too many receipts)') end
  -- The lowest noted first: record_refund forgets the first one and raises the
  -- floor past it, the least loss among those remembered (any order keeps once
  -- per receipt: the floor refuses whatever record is forgotten).
  table.sort(sort, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    if a[2] ~= b[2] then return a[2] < b[2] end
    return a[3] < b[3]
  end)
  for i, s in ipairs(sort) do r.ids[i] = s[4] end
  return r
end

-- The refund head's name for its fields.
local function log_refunds_head(ledger, floor, born)
  return 'refunds:' .. fmt(ledger) .. ':' .. fmt(floor) .. ':' .. fmt(born)
end

local function sliding_log(key, n, write, p, l)
  local meta, err = log_refunds(key)
  if err then return err end
  local parse = log_member
  local function at_rank(rank)
    return parse(redis.call('ZRANGE', key, rank, rank, 'WITHSCORES'))
  end
  local newest = at_rank(-1)
  if newest == false then return malformed(key, 'member not instant:units:total') end
  local at = now
  -- An earlier reading is judged at the newest unit's instant: the log stays sorted.
  if newest and newest.at > at then at = newest.at end
  -- Nor earlier than a newest unit that a refund gave back (its admission dropped
  -- the units that had left the window at its instant, which an earlier reading
  -- would count): as the in-process log.
  if meta and meta.logged > at then at = meta.logged end
  local oldest = parse(redis.call('ZRANGEBYSCORE', key, '(' .. fmt(at - p), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1))
  if oldest == false then return malformed(key, 'member not instant:units:total') end
  local units, before, reset = 0, 0, 0
  if oldest then
    before = oldest.total - oldest.units
    units = newest.total - before
    -- Running totals never fall: the window holds at least its oldest and its
    -- newest member's units (a smaller count would admit beyond the limit).
    if units < oldest.units or units < newest.units then
      return malformed(key, 'running totals fall')
    end
    reset = newest.at + p - now
  end
  if n > l then
    return reply(false, l, l - units, reset, -1)
  end
  if n == 0 then
    return reply(true, l, l - units, reset, 0)
  end
  if units + n <= l then
    -- With no live member the totals begin again.
    local logged, total = n, n
    if oldest then total = newest.total + n end
    if newest and newest.at == at then logged = logged + newest.units end
    local live
    if total > 4503599627370496 then
      -- Past 2^52 the totals would leave the exact range: the live members count
      -- from the oldest again (at most L units are live, L below 2^51). Read, and
      -- found well formed, before anything is written — also by a dry run.
      local found = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(at - p), '+inf', 'WITHSCORES')
      live = {}
      for i = 1, #found, 2 do
        live[#live + 1] = parse({ found[i], found[i + 1] })
        if not live[#live] then return malformed(key, 'member not instant:units:total') end
      end
      total = total - before
    end
    if write then
      -- A charge with receipts on a key without refund members gives it its head,
      -- of an incarnation of its own.
      if ISSUING and not meta then
        meta = { ledger = 0, floor = 0, born = incarnation(), logged = 0 }
        meta.names = { log_refunds_head(0, 0, meta.born) }
        redis.call('ZADD', key, '-inf', meta.names[1])
      end
      if live then
        redis.call('DEL', key)
        for _, name in ipairs(meta and meta.names or {}) do
          redis.call('ZADD', key, '-inf', name)
        end
        for _, m in ipairs(live) do
          if m.at ~= at then
            redis.call('ZADD', key, fmt(m.at),
              fmt(m.at) .. ':' .. fmt(m.units) .. ':' .. fmt(m.total - before))
          end
        end
      else
        -- '(-inf': the refund members stay.
        redis.call('ZREMRANGEBYSCORE', key, '(-inf', fmt(at - p))
        if logged > n then redis.call('ZREMRANGEBYSCORE', key, fmt(at), fmt(at)) end
      end
      redis.call('ZADD', key, fmt(at), fmt(at) .. ':' .. fmt(logged) .. ':' .. fmt(total))
      local ms = ttl_ms(at + p - now)
      if ms then redis.call('PEXPIRE', key, fmt(ms)) end
      -- The instant, the cost, the running total after the charge, the ledger it
      -- saw, the key's incarnation (0 and 0 without refund member).
      RECEIPT = { at, n, total, meta and meta.ledger or 0, meta and meta.born or 0 }
    end
    return reply(true, l, l - units - n, at + p - now, 0)
  end
  -- The oldest units + n - L units must leave; the last of them leaves at x + P,
  -- x the instant of the first live member whose total reaches them (binary search
  -- by rank between the oldest live member and the newest).
  local target = before + units + n - l
  local lo = redis.call('ZCOUNT', key, '-inf', fmt(at - p))
  local hi = redis.call('ZCARD', key) - 1
  while lo < hi do
    local mid = fdiv(lo + hi, 2)
    local m = at_rank(mid)
    if not m then return malformed(key, 'member not instant:units:total') end
    if m.total >= target then hi = mid else lo = mid + 1 end
  end
  local last = at_rank(lo)
  if not last or last.total < target then
    return malformed(key, 'log shorter than its count')
  end
  return reply(false, l, l - units, reset, last.at + p - now)
end

-- Members a command at most when a refund writes the log: Lua's unpack gives at
-- most about 8000 values (LUAI_MAXCSTACK, Redis's Lua 5.1), a ZADD takes two a
-- member, and a refund may rewrite more members than that (at most L under one
-- policy, L up to 2^51).
local LOG_BATCH = 2000

-- Runs `command` on `key` with the values of `args`, `per` values a member, at
-- most LOG_BATCH members a call (none for no values).
local function batched(command, key, args, per)
  local step = LOG_BATCH * per
  for i = 1, #args, step do
    redis.call(command, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end

-- Gives back the `n` units a charge logged at instant `x` (the running total after
-- it `total`, the ledger it saw `noted`) in incarnation `born` of the log at `key`,
-- as the in-process log does: only while that instant is still in the window of
-- period `p` at the reading (judged no earlier than the newest unit logged), all
-- of them or nothing. Units logged at one instant are interchangeable: the
-- member at `x` loses `n` (removed at 0) and every later member's running total
-- drops by `n`, the log the other charges would have made: one ZREM of every
-- member from `x` on and one ZADD of those left, each split by LOG_BATCH members
-- (at most L members under one policy: each holds a unit of the window at the
-- reading; more only under a rolling deploy of another period or limit), and at
-- most six commands for the refund members (and one more a record forgotten on a
-- key of more than this refund keeps, which a refund with WIDE_LOG on writes).
-- Once per receipt (noted/x/total), by the ledger (units given back), floor and
-- records shared with the windows (each record a member of its own here).
-- Returns the units given back and the function that writes them back (none for
-- 0), or an error reply: the key's members are read and checked once, written
-- nothing until that function runs, which writes from what was read
-- (multi_refund.lua checks every key so before it writes one).
local function sliding_log_refund(key, x, n, total, noted, born, p)
  local meta, err = log_refunds(key)
  if err then return err end
  -- A key lost and created again (or one no charge with receipts made) holds none
  -- of the charge's units.
  if not meta or meta.born ~= born then return 0 end
  local list = meta.ids
  local id = fmt(noted) .. '/' .. fmt(x) .. '/' .. fmt(total)
  if not refundable(list, id, noted, meta.ledger, meta.floor) then return 0 end
  local newest = log_member(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES'))
  if newest == false then return malformed(key, 'member not instant:units:total') end
  local t = now
  if newest and newest.at > t then t = newest.at end
  if meta.logged > t then t = meta.logged end
  -- Left the window (or an instant no charge of this key logged at).
  if x > t or t - x >= p then return 0 end
  -- The members from x on, and from the earliest instant of a record before it
  -- (whether those instants still hold units, below): one read.
  local from = x
  for _, r in ipairs(list) do
    local rx = tonumber(string.match(r, '^%d+/(%d+)/'))
    if rx < from then from = rx end
  end
  local found = redis.call('ZRANGEBYSCORE', key, fmt(from), '+inf', 'WITHSCORES')
  local after, held = {}, {}
  for i = 1, #found, 2 do
    local m = log_member({ found[i], found[i + 1] })
    if not m then return malformed(key, 'member not instant:units:total') end
    held[m.at] = true
    if m.at >= x then after[#after + 1] = m end
  end
  local own = after[1]
  if not own or own.at ~= x or own.units < n or n <= 0 then return 0 end
  -- Every later total at least the one before it plus its units, else running
  -- totals fall: a state no script writes, which the rewrite below would keep
  -- (or mix up, a later member named as the one at x is once renamed). So each
  -- later total less n still holds its units (the first total holds n at least).
  for i = 2, #after do
    if after[i].total - after[i - 1].total < after[i].units then
      return malformed(key, 'running totals fall')
    end
  end
  -- A ledger past 2^53 would leave the key malformed for every later call: such a
  -- refund gives nothing (a conservative loss, as the floor's).
  if meta.ledger + n >= EXACT then return 0 end
  local logged = meta.logged
  if newest and newest.at > logged then logged = newest.at end
  -- The records kept: those of a receipt that may still give back. One whose
  -- instant is before `logged` (which never falls, and which every version's
  -- charge logs no earlier than) with no unit left there after this refund gives
  -- back nothing again (a refund takes units only from a member at its instant,
  -- and no member is made there again): forgotten without raising the floor.
  -- So a crowd charged at distinct instants and given back in any order keeps a
  -- record or two; REFUNDS_KEPT bounds the rest, or REFUNDS_KEPT_WIDE where
  -- WIDE_LOG is on (step 2, the builder's `wide_log_refunds`: a version before
  -- session 47 reads no more than REFUNDS_KEPT; with it off, a key of more,
  -- written with it on, is trimmed to REFUNDS_KEPT, the floor raised).
  local live = {}
  for _, r in ipairs(list) do
    local rx = tonumber(string.match(r, '^%d+/(%d+)/'))
    local holds = held[rx]
    if rx == x then holds = own.units > n end
    if rx >= logged or holds then live[#live + 1] = r end
  end
  return n, function()
    local was = {}
    for _, r in ipairs(list) do was[r] = true end
    local _, floor = record_refund(live, id, meta.floor,
      WIDE_LOG and REFUNDS_KEPT_WIDE or REFUNDS_KEPT)
    -- The new head first: the key never empties (it would lose its time to live,
    -- which these writes keep), and a write refused for memory (a ZADD) comes
    -- before any other. The ledger grew by n > 0: another name.
    redis.call('ZADD', key, '-inf', log_refunds_head(meta.ledger + n, floor, born))
    redis.call('ZREM', key, meta.head)
    if logged ~= meta.logged then
      redis.call('ZADD', key, '-inf', 'refunds:logged:' .. fmt(logged))
      if meta.logged_name then redis.call('ZREM', key, meta.logged_name) end
    end
    -- The record record_refund added, and those pruned or forgotten past
    -- REFUNDS_KEPT (never the new one).
    for _, r in ipairs(live) do
      if was[r] then was[r] = nil else redis.call('ZADD', key, '-inf', 'refunds:id:' .. r) end
    end
    for r in pairs(was) do redis.call('ZREM', key, 'refunds:id:' .. r) end
    -- Every member from x on renamed: one ZREM of the old names, then one ZADD of
    -- the new (no new name is an old one: each total dropped by n > 0, one member
    -- per instant), the member at x left out at 0 units. The key never holds more
    -- members than it did: a listpack stays one.
    local gone, put = {}, {}
    for i, m in ipairs(after) do
      gone[i] = m.name
      local units = m.units
      if i == 1 then units = units - n end
      if units > 0 then
        put[#put + 1] = fmt(m.at)
        put[#put + 1] = fmt(m.at) .. ':' .. fmt(units) .. ':' .. fmt(m.total - n)
      end
    end
    batched('ZREM', key, gone, 1)
    batched('ZADD', key, put, 2)
  end
end
