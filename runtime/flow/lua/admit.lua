-- KEYS[1] = one endpoint's token buckets (`flow:limits:<profile>`: a hash, fields `<d>` the
-- tokens left and `<d>:at` when last refilled, Redis's clock in ms, for d = req, in, out);
-- KEYS[2] = its requests in flight (`flow:in_flight:<profile>`: a sorted set, request id
-- scored by when its entry expires, Redis's clock in ms); KEYS[3] = the deployment's flow
-- counters (`flow:stats`: a hash, field `<counter>:<profile>:<tenant>`, never expiring; the metrics read
-- them, runtime/ops/flow_metrics.py).
-- ARGV[1] = the request asking now, or '' (settlements only); ARGV[2], ARGV[3], ARGV[4] = the
-- requests, input tokens, output tokens allowed per minute (0: no such limit); ARGV[5] = the
-- requests allowed in flight (0: no limit); ARGV[6] = the request's input token estimate; ARGV[7] = its output
-- token estimate; ARGV[8] = how long its in-flight entry lives (ms: the model timeout, so a
-- worker killed mid-request leaks nothing past it); ARGV[9] = the keys' TTL in ms; ARGV[10] =
-- how long to wait when only the in-flight limit is full (ms; at most until its first entry
-- expires); ARGV[11] = the counters' field suffix (`<profile>:<tenant>`, the asking run's
-- tenant as the metrics show it); ARGV[12] = the wait above which
-- the asking run suspends (ms; -1: it never does); ARGV[13] = 1 to count a wait in place, 0 when
-- the request already waits in place (counted once a wait); ARGV[14] = n, the settlements that
-- follow; then n triples: a request id (its
-- in-flight entry removed), its input and output corrections (actual - estimate: taken from
-- the buckets when positive, given back when negative; a bucket may go below zero, a debt).
-- Buckets refill continuously, their limit per minute, never above it; a new one is full. A
-- token bucket keeps RESERVE_MS of its refill in reserve: a request is admitted only while the
-- bucket would still hold that much after it, so requests that reach the provider up to that
-- much earlier than their admission's pace (the network, a busy worker) still find its bucket
-- refilled. It costs the reserve once, at a full bucket's first burst; the steady rate is the
-- limit.
-- Returns {0, ''} when the request is admitted (its estimates taken, its entry in flight),
-- else {ms to wait, the scarcest dimension: 'requests' | 'input_tokens' | 'output_tokens' |
-- 'in_flight'}, nothing taken. Counted: `admitted:<suffix>` for a request admitted,
-- `waits_suspended:<suffix>` or `waits_in_place:<suffix>` for a wait (as said above).
local RESERVE_MS = 1000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dims = {'req', 'in', 'out'}
local names = {req = 'requests', ['in'] = 'input_tokens', out = 'output_tokens'}
local cap = {req = tonumber(ARGV[2]), ['in'] = tonumber(ARGV[3]), out = tonumber(ARGV[4])}
local cost = {req = 1, ['in'] = tonumber(ARGV[6]), out = tonumber(ARGV[7])}
local level = {}
for _, d in ipairs(dims) do
  if cap[d] > 0 then
    local raw = redis.call('HMGET', KEYS[1], d, d .. ':at')
    local have = tonumber(raw[1] or cap[d])
    local at = tonumber(raw[2] or now)
    level[d] = math.min(cap[d], have + math.max(0, now - at) * cap[d] / 60000)
  end
end
local n = tonumber(ARGV[14])
for i = 0, n - 1 do
  local base = 15 + i * 3
  redis.call('ZREM', KEYS[2], ARGV[base])
  local fix = {['in'] = tonumber(ARGV[base + 1]), out = tonumber(ARGV[base + 2])}
  for d, by in pairs(fix) do
    if level[d] then
      level[d] = math.min(cap[d], level[d] - by)
    end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local wait, scarcest = 0, ''
if ARGV[1] ~= '' then
  for _, d in ipairs(dims) do
    local reserve = 0
    if d ~= 'req' then
      reserve = cap[d] * RESERVE_MS / 60000
    end
    local need = math.min(cost[d] + reserve, cap[d])
    if level[d] and level[d] < need then
      local ms = math.ceil((need - level[d]) * 60000 / cap[d])
      if ms > wait then
        wait, scarcest = ms, names[d]
      end
    end
  end
  local most = tonumber(ARGV[5])
  if wait == 0 and most > 0 and redis.call('ZCARD', KEYS[2]) >= most then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    wait = math.max(1, math.min(tonumber(ARGV[10]), tonumber(first[2]) - now))
    scarcest = 'in_flight'
  end
  if wait == 0 then
    for _, d in ipairs(dims) do
      if level[d] then
        level[d] = level[d] - cost[d]
      end
    end
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[8]), ARGV[1])
    redis.call('HINCRBY', KEYS[3], 'admitted:' .. ARGV[11], 1)
  else
    local above = tonumber(ARGV[12])
    if above >= 0 and wait > above then
      redis.call('HINCRBY', KEYS[3], 'waits_suspended:' .. ARGV[11], 1)
    elseif ARGV[13] == '1' then
      redis.call('HINCRBY', KEYS[3], 'waits_in_place:' .. ARGV[11], 1)
    end
  end
end
for _, d in ipairs(dims) do
  if level[d] then
    redis.call('HSET', KEYS[1], d, tostring(level[d]), d .. ':at', now)
  end
end
for _, key in ipairs({KEYS[1], KEYS[2]}) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('PEXPIRE', key, tonumber(ARGV[9]))
  end
end
return {wait, scarcest}
