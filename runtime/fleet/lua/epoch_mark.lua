-- KEYS[1] = the store epoch hash; ARGV[1] = the epoch id the caller saw, ARGV[2] = a mark
-- (`reconciled`: a full reconcile ran after the grace; `requeued`: queued runs were published
-- again). 1 for the one caller that set it in this epoch, 0 if set already or the epoch moved.
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
return redis.call('HSETNX', KEYS[1], ARGV[2], '1')
