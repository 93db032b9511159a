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

local function malformed(key, what)
  return redis.error_reply('floodgate: malformed state at key ' .. key .. ': ' .. what)
end

-- Past 2^52 us (the year 2112) the sums below could leave the exact range.
if now ~= now or now < 0 or now > 4503599627370496 then
  return redis.error_reply('floodgate: time ' .. tostring(now) .. ' us is beyond the exact range')
end
