-- Refunds of a multi-limit charge, in one run: for each key in KEYS, seven whole
-- numbers in ARG: the algorithm (1 GCRA, 2 fixed window, 3 sliding window, 4
-- sliding log) and the six its refund takes (the receipt's numbers, then the
-- limit's parameters). Every argument, then every key's state, is checked before
-- any refund is made (an error writes nothing); each limit then gives back what
-- its own refund rule allows, once per receipt. Returns what each gave back.
local refunds = { gcra_refund, fixed_window_refund, sliding_window_refund, sliding_log_refund }
if #ARG ~= 7 * #KEYS then
  return redis.error_reply('floodgate: a multi-limit refund takes 7 arguments per key')
end
local a = {}
for i = 1, #ARG do
  a[i] = tonumber(ARG[i])
  if not a[i] or a[i] < 0 or a[i] >= EXACT or a[i] ~= math.floor(a[i]) then
    return redis.error_reply('floodgate: refund argument ' .. i .. ' is not a whole number below 2^53')
  end
end
for i = 1, #KEYS do
  if not refunds[a[7 * i - 6]] then
    return redis.error_reply('floodgate: no refund for algorithm ' .. tostring(a[7 * i - 6]))
  end
end
-- Distinct keys: each key's refund is written from what its own read found, which
-- a write to the same key earlier in the run would have made stale.
local seen = {}
for i = 1, #KEYS do
  if seen[KEYS[i]] then
    return redis.error_reply('floodgate: a multi-limit refund names key ' .. KEYS[i] .. ' twice')
  end
  seen[KEYS[i]] = true
end
-- Every key read and checked, once, before any is written: a malformed state at a
-- later key fails the call with nothing written (no limit given back while the
-- call fails). Each refund then writes from what its read found.
local backs, writes = {}, {}
for i = 1, #KEYS do
  local j = 7 * i - 6
  local back, write = refunds[a[j]](KEYS[i], a[j + 1], a[j + 2], a[j + 3], a[j + 4], a[j + 5], a[j + 6])
  if type(back) == 'table' then return back end
  backs[i] = back
  writes[#writes + 1] = write
end
for _, write in ipairs(writes) do write() end
return backs
