-- KEYS[1] = the holder's leases set, KEYS[2] = its reserved set, KEYS[3] = holders set,
-- KEYS[4] = consumers set; ARGV[1] = holder. A worker's main process that ended cleanly is no
-- longer a consumer (a death's take drops it in take_dead.lua), and leaves `holders` too unless
-- it still has leases or reserved messages: those the death watch takes back once it is gone.
redis.call('SREM', KEYS[4], ARGV[1])
if redis.call('SCARD', KEYS[1]) == 0 and redis.call('SCARD', KEYS[2]) == 0 then
  redis.call('SREM', KEYS[3], ARGV[1])
  return 1
end
return 0
