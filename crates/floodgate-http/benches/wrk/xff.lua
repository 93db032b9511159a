-- wrk script: each request comes "from" one of 10,000 client addresses
-- (10.0.0.0 - 10.0.39.15, in turn), as a load balancer at 127.0.0.1 would report it
-- in X-Forwarded-For. Run against `api_server --trusted-proxy 127.0.0.1/32`:
--
--   wrk -t1 -c32 -d5s --latency -s crates/floodgate-http/benches/wrk/xff.lua http://ADDR/
local clients = 10000
local n = 0
local addresses = {}
for i = 0, clients - 1 do
  addresses[i] = string.format("10.0.%d.%d", math.floor(i / 256), i % 256)
end

request = function()
  n = (n + 1) % clients
  return wrk.format("GET", "/", { ["X-Forwarded-For"] = addresses[n] })
end
