-- KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the holder's leases set,
-- KEYS[4] = holders set; ARGV[1] = token, ARGV[2] = ttl ms, ARGV[3] = holder.
-- A lease last confirmed before Redis lost its data (a new store epoch): renewed while the key
-- still holds this token (1); taken back with `SET NX` of this same token, and indexed as an
-- acquire does, when the key is absent (2: Redis lost it, and nobody claimed the run since,
-- or a claimer's fence would hold the key); left alone when another token holds it (0). A
-- taken-back lease is trusted only once Postgres says its attempt still owns the run (I3).
local held = redis.call('GET', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  return 1
end
if held ~= false then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[3])
return 2
