"""The spec's row 2, guarded by Postgres's own counters: a read-only model step writes one
statement (its step record and the run's counters together: one row inserted into `run_steps`,
one row of `runs` updated) and nothing else, in at most three transactions. Two runs that differ
only by their number of read-only steps, each in a worker lifetime of its own, are counted by
the server (`pg_stat_user_tables`, `pg_stat_database`, flushed when the backends exit): what
the longer one wrote beyond the shorter, divided by the steps it added, is one read step. A
second write added to every read step fails this test."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from runtime.core.code_versions import noted_version
from store import db
from tests.support.scripts import call, final, step

SHORT, LONG = 2, 8
# What one read-only step may write: per table, rows (inserted, updated, deleted).
ONE_READ_STEP = {"run_steps": (1, 0, 0), "runs": (0, 1, 0)}


def _reads(tag: str, n: int) -> list[dict[str, Any]]:
    """A run of `n` read-only steps (one ticket read each), then its answer."""
    steps = [step(call(f"toolu_{tag}{i}", "ticket.read", ticket=f"T-{i}")) for i in range(n)]
    return [*steps, final("Read them all.")]


def _counters(stack) -> tuple[dict[str, tuple[int, int, int]], int]:
    """Rows written per table and transactions committed in the run's database, as the server
    counts them, once every other backend on it has exited (each flushes its counts as it
    goes). Read on a connection of its own: counts are cached per transaction."""
    url = stack.settings.database_url
    probe = db.create(url, pool_max=1)
    try:
        deadline = time.monotonic() + 30
        with probe.connect() as conn:
            while True:
                others = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid()"
                    )
                ).scalar()
                if not others:
                    break
                assert time.monotonic() < deadline, f"{others} backends never left"
                time.sleep(0.1)
        with probe.connect() as conn:
            tables = conn.execute(
                sa.text("SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables")
            ).all()
            xacts = conn.execute(
                sa.text(
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
                )
            ).scalar()
    finally:
        probe.dispose()
    return {t.relname: (t.n_tup_ins, t.n_tup_upd, t.n_tup_del) for t in tables}, int(xacts or 0)


def _lifetime(stack, tag: str, n: int) -> None:
    """One worker lifetime: start it, run `n` read-only steps to the end, stop it; then every
    connection of this process to the database is closed, so all counts reach the server."""
    worker = stack.worker(f"w-{tag}")
    run_id = stack.start(_reads(tag, n))
    assert stack.wait(run_id).status == "succeeded"
    assert stack.asked(run_id) == {s: 1 for s in range(1, n + 2)}
    worker.stop()
    stack.services.engine.dispose()


def test_a_read_only_step_writes_one_statement(stack) -> None:
    # A worker notes its code's version once per deploy, not per step: noted before counting.
    services = stack.services
    noted_version(services.engine, services.tools, services.model_profiles())
    stack.services.engine.dispose()
    start, start_xacts = _counters(stack)
    _lifetime(stack, "s", SHORT)
    short, short_xacts = _counters(stack)
    _lifetime(stack, "l", LONG)
    long_, long_xacts = _counters(stack)
    added = LONG - SHORT
    per_step: dict[str, tuple[float, ...]] = {}
    for table in sorted(set(start) | set(short) | set(long_)):
        a, b, c = (x.get(table, (0, 0, 0)) for x in (start, short, long_))
        extra = tuple(((c[i] - b[i]) - (b[i] - a[i])) / added for i in range(3))
        if any(extra):
            per_step[table] = extra
    assert per_step == ONE_READ_STEP
    # Its transactions (each autocommit statement is one, reads included): at most three.
    step_xacts = ((long_xacts - short_xacts) - (short_xacts - start_xacts)) / added
    assert step_xacts <= 3, f"a read-only step took {step_xacts:g} transactions"
