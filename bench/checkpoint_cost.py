"""What durability costs per model step: the fenced statements the engine runs, timed against a
real Postgres and Redis next to DESIGN.md's floor costs.

Each statement runs as the engine runs it: a pooled connection (pre-pinged), one autocommit
statement. Both the statement alone and the statement with its checkout are shown.
Usage: .venv/bin/python bench/checkpoint_cost.py [--iterations 500]
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections.abc import Callable

import redis
import sqlalchemy as sa
from common import print_table, quantile, throwaway

from runtime.leases import Leases, Token
from runtime.sealing import Sealer, new_key_entry, parse_keys
from runtime.settings import Timings
from store import db
from store.bench import insert_running_runs
from store.checkpoints import mark_in_doubt, record_outcome, write_checkpoint
from store.runs import claim_lost

CHECKPOINT_BYTES = 20_000  # a mid-sized transcript, sealed
LOSS_LIMIT = Timings().loss_limit
# DESIGN.md's floor cost of each statement (ms).
FLOORS = {
    "write_checkpoint": ("upsert", 0.6),
    "mark_in_doubt": ("fenced update", 0.4),
    "record_outcome": ("fenced update", 0.4),
    "claim_lost": ("claim", 0.7),
    "lease renew": ("renew", 0.15),
}

Samples = dict[str, list[tuple[float, float]]]


def timed(engine: sa.Engine, statement: Callable[[sa.Connection], object]) -> tuple[float, float]:
    """(statement ms, checkout + statement ms) for one statement on a pooled connection."""
    started = time.perf_counter()
    with engine.connect() as conn:
        before = time.perf_counter()
        statement(conn)
        after = time.perf_counter()
    done = time.perf_counter()
    return (after - before) * 1000, (done - started) * 1000


def checkpoint_payload() -> dict[str, object]:
    """A checkpoint like the engine's: messages and tool results, ~20 KB once sealed."""
    text = secrets.token_urlsafe(CHECKPOINT_BYTES)[: CHECKPOINT_BYTES - 1500]  # JSON, seal: ~1.5 KB
    chunks = [text[i : i + 500] for i in range(0, len(text), 500)]
    return {"messages": [{"role": "tool", "content": chunk} for chunk in chunks]}


def step(engine: sa.Engine, sealer: Sealer, run_id: str, n: int, samples: Samples) -> int:
    """One step's fenced writes: checkpoint, mark a write in doubt, record its outcome;
    returns the sealed checkpoint's size."""
    sealed = sealer.seal(run_id, "checkpoint", n, checkpoint_payload())
    outcome = sealer.seal(run_id, "outcome:0", n, {"ok": True, "id": f"INC-{n}"})
    samples["write_checkpoint"].append(
        timed(engine, lambda c: write_checkpoint(c, run_id, 1, n, sealed))
    )
    samples["mark_in_doubt"].append(
        timed(engine, lambda c: mark_in_doubt(
            c, run_id=run_id, attempt=1, step=n, call_index=0, call_id=f"toolu_{n}",
            tool="incident.create", kind="keyed_write", idem_key=f"{run_id}:{n}:0",
            stable_key=True,
        ))
    )  # fmt: skip
    samples["record_outcome"].append(
        timed(engine, lambda c: record_outcome(
            c, run_id=run_id, attempt=1, step=n, call_index=0, sealed_outcome=outcome
        ))
    )  # fmt: skip
    return len(sealed)


def renew(leases: Leases, token: Token) -> tuple[float, float]:
    """One compare-and-renew of a held lease (the heartbeat's and every call's check)."""
    started = time.perf_counter()
    ok = leases.renew(token)
    ms = (time.perf_counter() - started) * 1000
    assert ok, "the bench's own lease was not renewed"
    return ms, ms


def measure(url: str, redis_url: str, namespace: str, iterations: int) -> tuple[Samples, int]:
    """Run `iterations` steps and claims and renewals; the samples and the checkpoint size."""
    engine, sealer = db.create(url), parse_keys(new_key_entry("bench"))
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    leases = Leases(client, namespace, Timings().lease_ttl_ms)
    samples: Samples = {name: [] for name in FLOORS}
    try:
        with engine.connect() as conn:
            run_id = str(insert_running_runs(conn, 1)[0])
            lost = [str(r) for r in insert_running_runs(conn, iterations)]
        token = Token(run_id, 1, "bench")
        assert leases.acquire(token)
        size = 0
        for n in range(1, iterations + 1):
            size = step(engine, sealer, run_id, n, samples)
            samples["claim_lost"].append(
                timed(engine, lambda c, r=lost[n - 1]: claim_lost(c, r, 1, LOSS_LIMIT))
            )
            samples["lease renew"].append(renew(leases, token))
    finally:
        client.close()
        engine.dispose()
    return samples, size


def rows(samples: Samples) -> list[list[object]]:
    out: list[list[object]] = []
    for name, (label, floor) in FLOORS.items():
        alone = [s for s, _ in samples[name]]
        whole = [w for _, w in samples[name]]
        out.append([
            name, f"{quantile(alone, 0.5):.3f}", f"{quantile(alone, 0.95):.3f}",
            f"{quantile(whole, 0.5):.3f}", f"{quantile(whole, 0.95):.3f}",
            f"{floor:g} ({label})", f"{quantile(alone, 0.5) / floor:.2f}x",
        ])  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=500, help="steps timed (default 500)")
    args = parser.parse_args()
    if args.iterations < 1:
        parser.error("--iterations must be at least 1")
    with throwaway("ckpt") as b:
        samples, size = measure(b.database_url, b.redis_url, b.namespace, args.iterations)
    print_table(
        f"Per-step durability cost in ms: {args.iterations} iterations, sealed checkpoint "
        f"{size} bytes; 'with checkout' adds the pool's pre-ping, as the engine runs each",
        ["statement", "p50", "p95", "p50 with checkout", "p95 with checkout", "DESIGN.md floor",
         "p50 / floor"],
        rows(samples),
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
