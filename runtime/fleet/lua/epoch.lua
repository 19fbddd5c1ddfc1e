-- KEYS[1] = the store epoch hash; ARGV[1] = a fresh epoch id. What Redis this is: the hash's
-- `id` names the data (created here when absent, so a Redis that lost its data, restarted
-- empty or failed over to an empty replica, shows a new id), `born_ms` when that id was
-- created, `run_id` the server's own run id (INFO server: a restart or a failover changes it)
-- and `back_ms` when a new data id or run id was first seen, by Redis's clock. Returns
-- {id, born_ms, back_ms, now_ms, reconciled, requeued} (the last two: marks set once per
-- epoch by `epoch_mark.lua`). Every process calls it on its own (re)connects and looks; the
-- first caller after the store came back stamps `back_ms`.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
local id = redis.call('HGET', KEYS[1], 'id')
if not id then
  id = ARGV[1]
  redis.call('HSET', KEYS[1], 'id', id, 'born_ms', now, 'run_id', run, 'back_ms', now)
elseif redis.call('HGET', KEYS[1], 'run_id') ~= run then
  redis.call('HSET', KEYS[1], 'run_id', run, 'back_ms', now)
end
local f = redis.call('HMGET', KEYS[1], 'born_ms', 'back_ms', 'reconciled', 'requeued')
return {id, tonumber(f[1]), tonumber(f[2]), now, f[3] and 1 or 0, f[4] and 1 or 0}
