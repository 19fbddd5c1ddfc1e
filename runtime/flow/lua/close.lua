-- KEYS[1] = the deployment's closes (`flow:closed`: a hash, field per model profile -> closed
-- until, Redis's clock in ms); KEYS[2] = the backoff counts (`flow:backoffs`: field per profile
-- -> 429s met without a Retry-After in a row); KEYS[3] = the deployment's flow counters
-- (`flow:stats`, a hash, never expiring: `rate_limited:<profile>:<tenant>` counts the 429s met).
-- ARGV[1] = the profile; ARGV[2] = the Retry-After in ms, or -1 when the 429 said none;
-- ARGV[3] = the first backoff in ms (doubled at each 429 without a Retry-After); ARGV[4] = the
-- longest backoff in ms; ARGV[5] = the longest close in ms (a Retry-After above it is cut to
-- it); ARGV[6] = the channel the closes are published on (`flow:closes`); ARGV[7] = the tenant
-- of the run that met the 429, as the metrics show it.
-- A 429: close the endpoint for the whole fleet until now + its wait, never shortening a longer
-- close already set, and publish `<profile> <ms it stays closed>` (relative: each process counts
-- it down on its own clock). A profile open for the longest backoff has its count forgotten;
-- both keys live until the latest close ends plus the longest backoff. Returns the ms closed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local profile = ARGV[1]
redis.call('HINCRBY', KEYS[3], 'rate_limited:' .. profile .. ':' .. ARGV[7], 1)
local closed_until = tonumber(redis.call('HGET', KEYS[1], profile) or '0')
local wait = tonumber(ARGV[2])
if wait < 0 then
  if now >= closed_until + tonumber(ARGV[4]) then
    redis.call('HDEL', KEYS[2], profile)
  end
  local n = redis.call('HINCRBY', KEYS[2], profile, 1)
  wait = math.min(tonumber(ARGV[4]), tonumber(ARGV[3]) * 2 ^ math.min(n - 1, 30))
end
wait = math.floor(math.min(wait, tonumber(ARGV[5])))
if now + wait > closed_until then
  closed_until = now + wait
  redis.call('HSET', KEYS[1], profile, closed_until)
end
local left = closed_until - now
local ttl = left + tonumber(ARGV[4])
for _, key in ipairs({KEYS[1], KEYS[2]}) do
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
redis.call('PUBLISH', ARGV[6], profile .. ' ' .. left)
return left
