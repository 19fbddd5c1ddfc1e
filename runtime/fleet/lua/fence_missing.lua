-- KEYS = the lease keys of runs found running with no lease; ARGV[1] = ttl ms, ARGV[2..] = the
-- fence token for each key (`<run id>:<attempt>:~sweep`). Before the sweeper claims such a run
-- it holds the key itself, only where it is still absent: a holder taking its lease back after
-- Redis lost its data (`renew_or_take_back.lua`, SET NX) and the claim exclude each other, so a
-- claimed attempt never holds a lease again. Returns 1 per key fenced, 0 per key someone holds.
local got = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[i + 1], 'NX', 'PX', ARGV[1]) then
    got[i] = 1
  else
    got[i] = 0
  end
end
return got
