-- KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the run's step witness;
-- ARGV[1] = token, ARGV[2] = ttl ms, ARGV[3] = the step this attempt last wrote ("" if none),
-- ARGV[4] = the witness's ttl s.
-- Extends the lease only while it still holds this token: never renews a lease a newer
-- attempt has taken (which `SET XX` would); the witness moves up to the step written.
-- The witness() it calls is witness.lua, put in front of it by runtime/fleet/scripts.py.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
witness(KEYS[3], ARGV[3], ARGV[4])
return 1
