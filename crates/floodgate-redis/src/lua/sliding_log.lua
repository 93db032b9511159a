-- Sliding log. Arguments: key, cost n, write, P (period, us), L (limit).
-- State: a sorted set; one member per instant with admitted units, scored by the
-- instant (us), named "instant:units". A unit at x counts while now < x + P.
local function sliding_log(key, n, write, p, l)
  local function units_of(member)
    local u = tonumber(string.match(member, ':(%d+)$'))
    return u
  end
  local at = now
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] then
    local s = tonumber(newest[2])
    if not s then return malformed(key, 'score not a number') end
    -- An earlier reading is judged at the newest unit's instant: the log stays sorted.
    if s > at then at = s end
  end
  local live = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(at - p), '+inf', 'WITHSCORES')
  local units = 0
  for i = 1, #live, 2 do
    local u = units_of(live[i])
    if not u then return malformed(key, 'member not instant:units') end
    units = units + u
  end
  local reset = 0
  if #live > 0 then reset = tonumber(live[#live]) + p - now end
  if n > l then
    return reply(false, l, l - units, reset, -1)
  end
  if n == 0 then
    return reply(true, l, l - units, reset, 0)
  end
  if units + n <= l then
    if write then
      local logged = n
      if #live > 0 and tonumber(live[#live]) == at then
        logged = logged + units_of(live[#live - 1])
        redis.call('ZREM', key, live[#live - 1])
      end
      redis.call('ZADD', key, fmt(at), fmt(at) .. ':' .. fmt(logged))
      redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(at - p))
      local ms = ttl_ms(at + p - now)
      if ms then redis.call('PEXPIRE', key, fmt(ms)) end
    end
    return reply(true, l, l - units - n, at + p - now, 0)
  end
  -- The oldest units + n - L units must leave; the last of them leaves at x + P.
  local must_leave = units + n - l
  local seen = 0
  for i = 1, #live, 2 do
    seen = seen + units_of(live[i])
    if seen >= must_leave then
      return reply(false, l, l - units, reset, tonumber(live[i + 1]) + p - now)
    end
  end
  return malformed(key, 'log shorter than its count')
end
