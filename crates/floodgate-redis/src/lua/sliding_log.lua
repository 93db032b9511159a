-- Sliding log. Arguments: key, cost n, write, P (period, us), L (limit).
-- State: a sorted set; one member per instant with admitted units, scored by the
-- instant (us), named "instant:units:total", where total counts the units of this
-- member and of every older one since the log began. A unit at x counts while
-- now < x + P. The units in the window are the newest total less the total before
-- the oldest live member, so a decision reads a few members, not the whole
-- window: O(log² n) for n members (all of them only when the totals pass 2^52,
-- once per 2^51 units admitted at the least).
local function sliding_log(key, n, write, p, l)
  -- A member and its score as found: instant, units, total; nil when there is
  -- none, false when it is malformed.
  local function parse(found)
    if not found[1] then return nil end
    local u, t = string.match(found[1], '^%d+:(%d+):(%d+)$')
    local s = tonumber(found[2])
    u, t = tonumber(u), tonumber(t)
    -- A member holds no more units than its running total; that total (the script
    -- counts again past 2^52) and its instant are below 2^53, where sums are exact.
    if not s or not u or not t or u > t or t >= EXACT or s >= EXACT then return false end
    return { at = s, units = u, total = t }
  end
  local function at_rank(rank)
    return parse(redis.call('ZRANGE', key, rank, rank, 'WITHSCORES'))
  end
  local newest = at_rank(-1)
  if newest == false then return malformed(key, 'member not instant:units:total') end
  local at = now
  -- An earlier reading is judged at the newest unit's instant: the log stays sorted.
  if newest and newest.at > at then at = newest.at end
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
      if live then
        redis.call('DEL', key)
        for _, m in ipairs(live) do
          if m.at ~= at then
            redis.call('ZADD', key, fmt(m.at),
              fmt(m.at) .. ':' .. fmt(m.units) .. ':' .. fmt(m.total - before))
          end
        end
      else
        redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(at - p))
        if logged > n then redis.call('ZREMRANGEBYSCORE', key, fmt(at), fmt(at)) end
      end
      redis.call('ZADD', key, fmt(at), fmt(at) .. ':' .. fmt(logged) .. ':' .. fmt(total))
      local ms = ttl_ms(at + p - now)
      if ms then redis.call('PEXPIRE', key, fmt(ms)) end
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
