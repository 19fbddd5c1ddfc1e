-- KEYS = lease keys; ARGV = the fence token for each. Drops each fence `fence_missing.lua` set,
-- once its claim is done, so the run's next attempt takes its lease at once (a fence left by a
-- sweeper that died lapses by its TTL).
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then redis.call('DEL', key) end
end
return 1
