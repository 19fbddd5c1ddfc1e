-- KEYS[1] = lease key, KEYS[2] = deadlines zset, KEYS[3] = the holder's leases set,
-- KEYS[4] = the let-go set, KEYS[5] = the sweepers' pace key, KEYS[6] = their lock; ARGV[1] =
-- token, ARGV[2] = the fence token, ARGV[3] = ttl ms.
-- A holder that cannot reach Postgres while others can gives its lease up for a survivor to
-- claim as a store fault: while the key still holds its token, the key is fenced at once (as
-- `take_dead.lua` does, so no other delivery takes it meanwhile), the token's index entries are
-- dropped and it joins the let-go set the sweeper claims from (`Sweeper._claim_given_up`), and
-- the pace key and the sweep lock go so the next sweeper to look sweeps at once (a sweep of
-- this cut process may hold the lock, hung on Postgres; two sweeps at once are safe, each
-- claim is one conditional statement, I4). 0 when the key holds another token already (the
-- run was claimed: nothing to give).
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('DEL', KEYS[5], KEYS[6])
return 1
