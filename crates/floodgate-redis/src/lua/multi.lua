-- Several limits on one request, all or nothing. ARG: cost, write (0 a peek, 1 a
-- check, 2 a check whose charges return their receipts after each decision), then
-- for each key in KEYS: the algorithm (1 GCRA, 2 fixed window, 3 sliding window, 4
-- sliding log) and its two parameters. Every limit decides first without writing;
-- only if all admit (and this is a check of a positive cost) is each charged — with
-- the same time and states, so each charge decides as its dry run did.
local transitions = { gcra, fixed_window, sliding_window, sliding_log }
local n = tonumber(ARG[1])
local write = ARG[2] == '1' or ARG[2] == '2'
local receipts = ARG[2] == '2'
ISSUING = receipts
local function run(i, charge)
  local j = 3 + (i - 1) * 3
  local transition = transitions[tonumber(ARG[j])]
  if not transition then
    return redis.error_reply('floodgate: unknown algorithm ' .. tostring(ARG[j]))
  end
  return transition(KEYS[i], n, charge, tonumber(ARG[j + 1]), tonumber(ARG[j + 2]))
end
local replies = {}
local all = true
for i = 1, #KEYS do
  local r = run(i, false)
  if r.err then return r end
  replies[i] = r
  if r[1] ~= 1 then all = false end
end
if all and write and n > 0 then
  for i = 1, #KEYS do
    RECEIPT = false
    local r = run(i, true)
    if r.err then return r end
    if receipts and RECEIPT then
      for j = 1, #RECEIPT do r[5 + j] = RECEIPT[j] end
    end
    replies[i] = r
  end
end
return replies
