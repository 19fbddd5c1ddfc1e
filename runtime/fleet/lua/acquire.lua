-- KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the holder's leases set,
-- KEYS[4] = holders set, KEYS[5] = the reserving process's reserved set, KEYS[6] = the run's
-- step witness; ARGV[1] = token, ARGV[2] = ttl ms, ARGV[3] = holder, ARGV[4] = reserved member
-- ("" if none).
-- Drops the message's reservation (the delivery has started: it becomes the lease, or it is
-- acked or requeued as its result says), then sets the lease only if nobody holds it and
-- indexes its deadline (by Redis's own clock) and its holder. Returns 0, or {1, the witness
-- ("" when there is none)}.
if ARGV[4] ~= '' then redis.call('SREM', KEYS[5], ARGV[4]) end
local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not ok then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[3])
return {1, redis.call('GET', KEYS[6]) or ''}
