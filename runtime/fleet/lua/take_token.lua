-- KEYS[1] = lease key, KEYS[2] = the holder's leases set; ARGV[1] = token.
-- One lease taken back from a pool child its parent saw die: deleted while it holds this
-- token, and also ours to claim when it has lapsed already (a parent can see the death after
-- the lease's TTL on a loaded machine), exactly as `take_dead.lua` does; a lease a newer attempt
-- holds is left alone. The claim in Postgres is fenced by the attempt (I4).
redis.call('SREM', KEYS[2], ARGV[1])
local held = redis.call('GET', KEYS[1])
if held == false then return 1 end
if held ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
