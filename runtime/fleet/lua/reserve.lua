-- KEYS[1] = the holder's reserved set, KEYS[2] = holders set; ARGV[1] = member, ARGV[2] = holder.
-- A worker's main process reserved a run's message: visible to the death watch if it dies.
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
