-- KEYS[1] = the Postgres-reached zset; ARGV[1] = holder. How long ago (ms, by Redis's clock)
-- any other holder last reached Postgres; -1 if none is known.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local top = redis.call('ZREVRANGE', KEYS[1], 0, 1, 'WITHSCORES')
for i = 1, #top, 2 do
  if top[i] ~= ARGV[1] then return now - tonumber(top[i + 1]) end
end
return -1
