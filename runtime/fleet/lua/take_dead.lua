-- KEYS[1] = the holder's presence epoch, KEYS[2] = its leases set, KEYS[3] = its reserved set,
-- KEYS[4] = holders set, KEYS[5] = consumers set; ARGV[1] = the epoch seen while it was
-- absent, ARGV[2] = holder, ARGV[3] = the lease key prefix, ARGV[4] = the fence's ttl ms. A
-- dead holder's work (and its place among the consumers the death watch takes), taken
-- back only if it has not reconnected since (a reconnect bumps the epoch first): each lease
-- still holding its token, or lapsed already, is fenced (the key set to the fence token, as
-- `fence_missing.lua` does) until the claim is committed (`Leases.unfence`), so a holder that
-- comes back after all fails its renewals and cannot take the lease back (`renew_or_take_back.lua`
-- is SET NX) while its run is claimed. Returns those tokens (a later attempt's lease is left
-- alone), with the messages it had reserved; false when it came back. Deadline entries stay
-- for the sweeper.
local epoch = redis.call('GET', KEYS[1]) or ''
if epoch ~= ARGV[1] then return false end
local taken = {}
for _, token in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local run, attempt = string.match(token, '^([^:]+):([^:]+):')
  local held = run and redis.call('GET', ARGV[3] .. run)
  if run and (held == token or held == false) then
    redis.call('SET', ARGV[3] .. run, run .. ':' .. attempt .. ':~sweep', 'PX', ARGV[4])
    table.insert(taken, token)
  end
end
local reserved = redis.call('SMEMBERS', KEYS[3])
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[2])
redis.call('SREM', KEYS[5], ARGV[2])
return {taken, reserved}
