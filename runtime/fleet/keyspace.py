"""Every Redis key the engine writes, under its deployment's namespace (`LIYAGENT_NAMESPACE`),
and what bounds it: a TTL, the death watch's clean-up once its holder is judged dead, or being
one of a fixed set (one key per deployment, whatever the number of runs or processes).

A key named after a run or a process that lived without a bound would grow with every run or
every process start (issue 31: one `presence:epoch:<holder>` per worker process, forever), so
each new key belongs here, with its bound, and the keyspace test
(tests/integration/fleet/test_redis_keys.py) starts and kills workers and checks every key left
against this page.
"""

from __future__ import annotations

# Keys without a TTL, one each per deployment. Their members or values are bounded as said.
FIXED: dict[str, str] = {
    "holders": "set of holders with leases or reserved messages; a holder leaves it when it "
    "releases its last, or when the death watch takes its work",
    "holders:consumers": "set of worker main processes consuming the runs' queue (each put back "
    "at its presence's reconnects); one leaves it when it ends cleanly, or when the death watch "
    "takes its work",
    "holders:queues": "set of the queues the consumers take messages from (each consumer's at "
    "its presence's connects); bounded by the deployment's queues",
    "leases:deadlines": "sorted set of live leases' deadlines; an entry goes at release, or when "
    "the sweeper finds it lapsed",
    "leases:let_go": "set of leases given up for want of Postgres; an entry goes once claimed",
    "postgres:reached": "sorted set of when each holder last reached Postgres; entries older "
    "than a minute are dropped",
    "store:epoch": "hash naming which Redis this is (data id, server run id, marks)",
    "sweeper:count": "counter of sweeps (every Nth is a full reconcile)",
    "metrics:sweep_ms": "list of the latest sweep durations, trimmed to 1,000",
    "metrics:sweep_count": "counter",
    "metrics:sweep_ms_total": "counter",
    "metrics:fenced_total": "counter",
    "metrics:retention_runs_total": "counter",
    "metrics:retention_audit_total": "counter",
    "metrics:retention_events_total": "counter",
    "metrics:retention_batches_total": "counter",
    "flow:stats": "hash of the model endpoints' counters (runtime/flow/): a field per counter "
    "(admitted, waits_in_place, waits_suspended, rate_limited) and declared profile",
}

# Keys named after a run or a process, each with its bound (`<...>` a run id, a holder).
NAMED: dict[str, str] = {
    "checkpoint:<run id>": "a lease, or a sweeper's fence: the lease TTL (8 s), renewed while held",
    "steps:<run id>": "the run's step witness: 30 days past its last renewal; deleted when the "
    "run ends",
    "presence:epoch:<holder>": "a process's presence epoch: 15 s past its last refresh (every "
    "second while the process lives)",
    "holder:<holder>:leases": "a holder's leases (a set, gone when empty); emptied as it "
    "releases them, deleted by the death watch when the holder is judged dead",
    "holder:<holder>:reserved": "a worker's reserved messages; as above",
    "outage:postgres:<holder>:said": "Postgres out of reach, said: 10 s",
    "outage:postgres:<holder>:open": "Postgres out of reach, not yet said back: 24 h; deleted "
    "when Postgres answers",
    "sweeper:pace": "the fleet's sweep turn: two thirds of the sweep interval",
    "sweeper:lock": "the sweep lock: the lease TTL",
    "deaths:leader": "the death watch's leader: 2 s, renewed while it leads",
    "flow:closed": "the model endpoints' closes (runtime/flow/), a hash, field per model "
    "profile -> until: until the latest close ends plus the longest backoff (a minute)",
    "flow:backoffs": "the endpoints' backoff counts, a hash, field per model profile: as "
    "flow:closed",
    "flow:limits:<profile>": "a model endpoint's token buckets under its profile's limits "
    "(runtime/flow/limits.py), one per profile that declares limits: two minutes past its last "
    "request",
    "flow:in_flight:<profile>": "that endpoint's requests in flight, a sorted set whose entries "
    "expire after the model timeout: as flow:limits:<profile>",
    "seal:dev-key-said:<fingerprint>": "the development seal key was announced: 15 minutes",
    "usage:note:<run id>:<attempt>": "what an attempt reserved for the model step it asked "
    "(runtime/fleet/usage_notes.py), read by the claim of its loss: an hour",
}

# Celery's own keys (kombu's Redis transport), under the same namespace: the run and ops queues
# (lists, gone when empty), the exchanges' binding sets and their deadlines, the unacknowledged
# messages (`unacked`, `unacked_index`: each message until it is acked, or restored after the
# visibility timeout) and `unacked_mutex` (a TTL); remote-control queues `<node>.celery.pidbox`
# and reply queues expire by themselves. Bindings name Celery nodes (`-n`), not processes.
BROKER_PREFIXES = ("_kombu.", "unacked")
