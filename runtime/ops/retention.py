"""Retention: beat deletes what finished runs no longer need, in bounded batches, oldest first;
an operator runs a pass now, or asks what one would delete, with `liyagent retention run`.

What is kept and for how long is `Retention` and LIYAGENT_ANSWER_RETENTION_S
(runtime/base/settings.py), as they are when the pass runs: every keep is counted from a run's
finish, so a setting lowered applies to the runs finished before it. The rules a deletion must
keep (a run not finished, an answer not handed on, a key that still dedupes, a parent still
running) are in the statement (store/retention.py). Each batch is one statement that skips
rows another pass holds, so two beats are harmless; each is logged and counted in Redis
(liyagent_retention_deleted_total, runtime/ops/metrics.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis
import sqlalchemy as sa
import structlog

from runtime.base.settings import Settings
from store.retention import (
    Batch,
    Expired,
    Keeps,
    count_expired,
    delete_expired_audit,
    delete_expired_events,
    delete_expired_runs,
)

log = structlog.get_logger(__name__)

# Redis counters behind liyagent_retention_deleted_total{what} and _batches_total.
COUNTERS = {
    "runs": "metrics:retention_runs_total",
    "audit": "metrics:retention_audit_total",
    "events": "metrics:retention_events_total",
}
BATCHES = "metrics:retention_batches_total"


@dataclass
class RetentionReport:
    """What one pass deleted: runs, audit rows and published events, and the batches it took."""

    enabled: bool = True
    runs: int = 0
    audit: int = 0
    events: int = 0
    batches: int = 0
    per_batch: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "enabled": self.enabled,
            "runs": self.runs,
            "audit": self.audit,
            "events": self.events,
            "batches": self.batches,
        }


def keeps_of(settings: Settings) -> Keeps:
    """The keeps in force: the retention settings and the answer's."""
    r = settings.retention
    return Keeps(
        keep_s=r.keep_s,
        key_window_s=r.key_window_s,
        answer_keep_s=settings.answer_retention_s,
        audit_keep_s=r.audit_keep_s,
    )


def run_retention(
    engine: sa.Engine, client: redis.Redis[bytes], settings: Settings, *, until_done: bool = False
) -> RetentionReport:
    """One pass: batches of expired runs until one comes back short (or `max_batches`, unless
    `until_done`: an operator's pass goes on until nothing is left), then batches of expired
    audit rows likewise, counted in `client` under the settings' namespace. Off
    (LIYAGENT_RETENTION=false): deletes nothing."""
    r = settings.retention
    report = RetentionReport(enabled=r.enabled)
    if not r.enabled:
        return report
    keeps = keeps_of(settings)
    with engine.connect() as conn:
        for what in ("runs", "audit", "events"):
            done = 0
            while until_done or done < r.max_batches:
                started = time.perf_counter()
                if what == "runs":
                    batch = delete_expired_runs(conn, keeps, batch=r.batch)
                elif what == "audit":
                    batch = delete_expired_audit(conn, keep_s=keeps.audit_keep_s, batch=r.batch)
                else:  # an event's key dedupes for the key window, as a request key does
                    batch = delete_expired_events(conn, keep_s=keeps.key_window_s, batch=r.batch)
                _record(
                    client, settings.namespace, what, batch, (time.perf_counter() - started) * 1000
                )
                setattr(report, what, getattr(report, what) + batch.deleted)
                report.batches += 1
                report.per_batch.append(batch.deleted)
                done += 1
                if batch.deleted < r.batch:
                    break
    return report


def expired_now(engine: sa.Engine, settings: Settings) -> Expired:
    """What a pass run until done would delete now under the settings in force, by table
    (deletes nothing, locks nothing): `liyagent retention run --dry-run`."""
    with engine.connect() as conn:
        return count_expired(conn, keeps_of(settings))


def _record(client: redis.Redis[bytes], ns: str, what: str, batch: Batch, ms: float) -> None:
    """The batch's log line and its counters (a Redis that is down loses a count, never a
    deletion: the rows are gone either way)."""
    log.info(
        "retention.batch",
        what=what,
        deleted=batch.deleted,
        oldest=batch.oldest.isoformat() if batch.oldest else None,
        newest=batch.newest.isoformat() if batch.newest else None,
        ms=round(ms, 1),
    )
    try:
        pipe = client.pipeline(transaction=False)
        pipe.incrby(f"{ns}{COUNTERS[what]}", batch.deleted)
        pipe.incr(f"{ns}{BATCHES}")
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("retention.uncounted", what=what, deleted=batch.deleted, error=str(exc))
