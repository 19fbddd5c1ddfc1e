-- KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the holder's leases set,
-- KEYS[4] = holders set, KEYS[5] = the holder's reserved set, KEYS[6] = the run's step
-- witness; ARGV[1] = token, ARGV[2] = holder, ARGV[3] = the step this attempt last wrote (""
-- if none), ARGV[4] = the witness's ttl s, ARGV[5] = "1" when the run has ended.
-- Deletes the lease only if it still holds this token (recording the step written, or, the run
-- ended, dropping the witness); always drops the token's index entries, and the holder from
-- `holders` once it has nothing left.
-- The witness() it calls is witness.lua, put in front of it by runtime/fleet/scripts.py.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
if redis.call('SCARD', KEYS[3]) == 0 and redis.call('SCARD', KEYS[5]) == 0 then
  redis.call('SREM', KEYS[4], ARGV[2])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[5] == '1' then redis.call('DEL', KEYS[6]) else witness(KEYS[6], ARGV[3], ARGV[4]) end
return 1
