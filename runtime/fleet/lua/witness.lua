-- The step witness (`steps:<run id>`): the highest step any attempt of the run has written,
-- kept beside the lease (`WITNESS_TTL_S` in tokens.py, renewed while the run runs, deleted when it ends) so a
-- step removed from Postgres afterwards is seen (runtime/core/attempt.py `_load_state`). Only
-- the lease's holder moves it, only upwards; a lost Redis loses it, never a run.
local function witness(key, step, ttl)
  if step == '' then return end
  local now = tonumber(redis.call('GET', key) or '-1')
  if tonumber(step) > now then
    redis.call('SET', key, step, 'EX', ttl)
  else
    redis.call('EXPIRE', key, ttl)
  end
end
