-- KEYS[1] = the Postgres-reached zset (member = holder, score = Redis ms); ARGV[1] = holder,
-- ARGV[2] = how long an entry is kept (ms). This holder's probe just reached Postgres: its
-- entry is stamped by Redis's clock; entries of holders gone longer than that are dropped.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
return 1
