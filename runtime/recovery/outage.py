"""Postgres out of reach: the one sentence every process says about it (the CLI, a worker that
refuses to start, a worker whose database went away later), and how a worker waits an outage
out. The message a worker holds is kept (never acked), its retries back off, and the worker
says so once per interval for all its processes together, not once per message and process.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import redis
import sqlalchemy as sa
import structlog

from runtime.base import drain
from runtime.services import Services
from store import db

log = structlog.get_logger(__name__)

T = TypeVar("T")

# A held message is tried again after FIRST_PAUSE_S, then after twice the last pause, up to
# LONGEST_PAUSE_S: a database back is used within seconds, a dead one costs a try per pause.
FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 2.0
# How often a worker says its database is still out of reach (one line, all its processes).
REPORT_EVERY_S = 10.0
# How long the "an outage was said" marker outlives its last line, so that "it is over" is said
# once, by the first process of the worker that reaches the database again.
_OPEN_TTL_S = 24 * 3600


def database_problem(exc: BaseException, url: str) -> str:
    """What is wrong with the database at `url` and what to do: the sentence the CLI prints
    (exit 3) and a worker refuses to start with. The password never appears."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    why = text.splitlines()[0] if text else type(orig).__name__
    if "database" in why and "does not exist" in why:
        name = sa.make_url(url).database
        advice = f"create it (createdb {name}), then run `liyagent db upgrade`"
    elif "unsupported startup parameter" in why:
        # PgBouncer refuses the session options a direct link sets at connect.
        advice = (
            "LIYAGENT_DATABASE_URL goes through a connection pooler (PgBouncer), which takes no "
            "session options: set LIYAGENT_DATABASE_POOLER=pgbouncer"
        )
    elif _all_read_only(text):
        why = "every host it names is read-only: a standby, or a primary in read-only mode"
        advice = (
            "with target_session_attrs=read-write only a primary is taken: promote a standby, "
            "or add the primary's host:port to LIYAGENT_DATABASE_URL"
        )
    else:
        advice = "start it, or point LIYAGENT_DATABASE_URL at a running server"
    return f"cannot use Postgres at {db.shown(url)} ({why}); {advice}"


def _all_read_only(text: str) -> bool:
    """Whether every connection attempt libpq reports (one line each, a multi-host URL listing
    them all) was refused for a read-only session, not for want of a server."""
    attempts = [line for line in text.splitlines() if "failed:" in line]
    return bool(attempts) and all(
        line.rstrip().endswith(("session is read-only", "server is in hot standby mode"))
        for line in attempts
    )


def schema_problem(exc: BaseException) -> str:
    """A database that answers but holds no schema (never migrated): as the CLI says it (exit
    1). Its first line is the server's, naming our table only."""
    orig = getattr(exc, "orig", None) or exc
    why = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    return f"the database is not ready ({why}); run `liyagent db upgrade`"


@dataclass
class Outage:
    """This process's view of an outage: since when it cannot use the database, and the pause
    before its next try (pure: the clock is a parameter)."""

    clock: Callable[[], float] = time.monotonic
    since: float | None = None
    pause_s: float = 0.0

    def failed(self) -> float:
        """A use of the database failed for want of it: the pause before the next try."""
        if self.since is None:
            self.since, self.pause_s = self.clock(), FIRST_PAUSE_S
        else:
            self.pause_s = min(self.pause_s * 2, LONGEST_PAUSE_S)
        return self.pause_s

    def answered(self) -> float | None:
        """The database answered: for how long it was out of reach here, None if it was not."""
        if self.since is None:
            return None
        lasted, self.since, self.pause_s = self.clock() - self.since, None, 0.0
        return lasted


_here = Outage()


class AuditGap:
    """Audit rows this process could not write while Postgres was out of reach, by kind. Each
    attempt's end is in its own log line already; the gap in the audit trail is said once,
    with its counts, when Postgres answers again (issue 19), not once per row."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    def take(self) -> dict[str, int]:
        """The counts since the last take, now cleared (empty without a lock when none)."""
        if not self._counts:
            return {}
        with self._lock:
            counts = dict(self._counts)
            self._counts.clear()
        return counts


_gap = AuditGap()


def audit_unwritten(kind: str) -> None:
    """An audit row of `kind` could not be written for want of Postgres: counted for the gap."""
    _gap.add(kind)


def say_audit_gap() -> dict[str, int]:
    """Say, once, which audit rows this process could not write while Postgres was away."""
    gap = _gap.take()
    if gap:
        log.warning(
            "audit.gap",
            unwritten=gap,
            total=sum(gap.values()),
            next="those attempts' ends are in this process's log lines only (run.store_fault, "
            "run.error); the runs themselves are in Postgres",
        )
    return gap


@dataclass(frozen=True)
class Notice:
    """Where a worker's outage lines are paced (its Redis, under the deployment's namespace,
    marked by this process's holder) and the database they name."""

    redis: redis.Redis[bytes]
    namespace: str
    holder: str
    database_url: str

    @classmethod
    def of(cls, s: Services) -> Notice:
        """The fields of a process's assembly that saying an outage uses."""
        return cls(s.redis, s.settings.namespace, s.holder, s.settings.database_url)


def _keys(s: Notice, worker: str) -> tuple[str, str]:
    base = f"{s.namespace}outage:postgres:{worker}"
    return f"{base}:said", f"{base}:open"


def failed(s: Notice, worker: str, exc: BaseException, holding: str) -> float:
    """Postgres could not be used (`exc`, for which `db.unreachable` holds): count it in this
    process and say it, once per REPORT_EVERY_S for the whole `worker` (its main process's
    holder), naming the database and what to do; `holding` says what is kept meanwhile.
    Returns the pause before the next try."""
    pause = _here.failed()
    said, opened = _keys(s, worker)
    try:
        due = bool(s.redis.set(said, s.holder, nx=True, px=int(REPORT_EVERY_S * 1000)))
        if due:
            s.redis.set(opened, "1", ex=_OPEN_TTL_S)
    except redis.RedisError:
        due = True  # say it too often rather than never
    if due:
        since = _here.since if _here.since is not None else _here.clock()
        log.warning(
            "database.unreachable",
            database=db.shown(s.database_url),
            problem=database_problem(exc, s.database_url),
            unreachable_for_s=round(_here.clock() - since, 1),
            meanwhile=holding,
            next_line_in_s=REPORT_EVERY_S,
        )
    return pause


def answered(s: Notice, worker: str) -> None:
    """Postgres answered: if this process had seen it out of reach, the first process of the
    worker to get here says the outage is over (one line), and any gap in the audit trail."""
    say_audit_gap()
    lasted = _here.answered()
    if lasted is None:
        return
    try:
        first = bool(s.redis.delete(_keys(s, worker)[1]))
    except redis.RedisError:
        first = True
    if first:
        log.info(
            "database.reachable",
            database=db.shown(s.database_url),
            after_s=round(lasted, 1),
        )


def store_fault(exc: BaseException) -> bool:
    """Whether an attempt's `exc` is a statement or connect of the engine's lost to Postgres
    going away (an outage, a failover): a store fault, never a sign that the process or its
    run is broken. Only the error itself counts, never one it wraps: a tool's own database
    failing reaches the attempt as the tool's error (told to the model), and must not have the
    run given back again and again."""
    return isinstance(exc, sa.exc.SQLAlchemyError) and db.unreachable(exc)


def wait_for_database(
    s: Notice,
    engine: sa.Engine,
    worker: str,
    exc: BaseException,
    holding: str,
    check: Callable[[], None],
) -> None:
    """Wait, said once per interval for the whole `worker`, until one round trip to Postgres
    succeeds, calling `check` before each try (it raises to end the wait: a lease lost). A
    warm shutdown does not end the wait: what is held must still reach Postgres."""
    while True:
        pause = failed(s, worker, exc, holding)
        check()
        if drain.wait(pause):
            time.sleep(pause)  # shutting down: keep backing off, the wait goes on
        try:
            db.ping(engine)
        except sa.exc.SQLAlchemyError as again:
            if not db.unreachable(again):
                raise
            exc = again
            continue
        answered(s, worker)
        return


def tolerated(s: Notice, worker: str, work: Callable[[], T]) -> T | None:
    """A periodic task's work (a sweep, an intake, a purge): Postgres out of reach is said as
    above instead of raised with a traceback at every fire, and None is returned; the next
    fire tries again. Any other failure is raised as it is."""
    try:
        result = work()
    except sa.exc.SQLAlchemyError as exc:
        if not db.unreachable(exc):
            raise
        failed(s, worker, exc, "periodic work waits for the next fire")
        return None
    answered(s, worker)
    return result
