-- KEYS[1] = the deployment's closes (`flow:closed`: a hash, field per model profile -> closed
-- until, Redis's clock in ms). No ARGV.
-- What a process's subscriber reads on every (re)subscription, so a close published while it
-- was away is not missed: the closes in force, as a flat list `profile, ms left, ...` (ms by
-- Redis's clock, relative: the reader counts them down on its own).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local found = redis.call('HGETALL', KEYS[1])
local closed = {}
for i = 1, #found, 2 do
  local left = tonumber(found[i + 1]) - now
  if left > 0 then
    closed[#closed + 1] = found[i]
    closed[#closed + 1] = left
  end
end
return closed
