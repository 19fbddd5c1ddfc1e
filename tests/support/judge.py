"""The kill trials' judge applied to plain runs, for the fault trials: from Postgres and the
vendor's records only."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import sqlalchemy as sa

from liyagent.local import judge


@dataclass
class FaultVerdict:
    unfinished: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    failure_reasons: dict[str, str] = field(default_factory=dict)
    duplicate_writes: dict[str, int] = field(default_factory=dict)
    stale_writes: list[str] = field(default_factory=list)
    losses: int = 0

    def assert_clean(self) -> None:
        assert not self.unfinished, f"runs that never ended: {self.unfinished}"
        assert not self.failed, f"runs that failed: {self.failure_reasons}"
        assert not any(self.duplicate_writes.values()), f"duplicates {self.duplicate_writes}"
        assert not self.stale_writes, f"written after a takeover: {self.stale_writes}"


def judge_runs(stack, run_ids: list[str]) -> FaultVerdict:
    """Every run ended and succeeded; no vendor effect twice; nothing written after a takeover."""
    verdict = FaultVerdict()
    rows = {
        r.id: r
        for r in stack.rows(
            "SELECT id, status, failure_reason FROM runs WHERE id = ANY(CAST(:ids AS uuid[]))",
            ids=run_ids,
        )
    }
    for run_id in run_ids:
        row = rows.get(run_id)
        status = row.status if row else None
        if status == "failed":
            verdict.failed.append(run_id)
            verdict.failure_reasons[run_id] = str(row.failure_reason)
        elif status != "succeeded":
            verdict.unfinished.append(run_id)
    with stack.engine.connect() as conn, stack.sim_engine.connect() as vconn:
        for run_id, losses in judge.losses(conn, run_ids).items():
            for loss in losses:
                verdict.losses += 1
                n = sum(judge.stale_writes(conn, vconn, run_id, loss))
                if n:
                    verdict.stale_writes.append(f"{run_id} attempt {loss.attempt}: {n}")
        # A store fault's give-back or claim ends its attempt as a loss's claim does: nothing
        # written by that attempt after it (I3), though no loss is charged.
        for g in _store_faults(conn, run_ids):
            n = sum(judge.stale_writes(conn, vconn, g.run_id, judge.Loss(g.attempt, None, g.at)))
            if n:
                verdict.stale_writes.append(f"{g.run_id} attempt {g.attempt} (store fault): {n}")
        verdict.duplicate_writes = judge.duplicate_writes(vconn, run_ids)
    return verdict


def _store_faults(conn, run_ids: list[str]) -> list:
    """Each store-fault resume: the run, the attempt it ended and when (its audit row)."""
    return list(
        conn.execute(
            sa.text(
                "SELECT run_id, (detail->>'faulted_attempt')::int AS attempt, created_at AS at "
                "FROM audit_events WHERE kind = 'agent.run.store_fault' "
                "AND run_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": run_ids},
        ).all()
    )


def wait_all(stack, run_ids: list[str], timeout: float = 120) -> None:
    for run_id in run_ids:
        stack.wait(run_id, timeout=timeout)


def until_in_flight(stack, run_ids: list[str], at_least: int = 1, timeout: float = 30) -> None:
    """Wait until `at_least` of the runs have taken a step (a fault then cuts runs in flight)."""
    deadline = time.monotonic() + timeout
    while sum(stack.client.get(r).step >= 1 for r in run_ids) < at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} runs got going"
        time.sleep(0.05)


def run_rows(stack, runs: list[str]) -> list:
    """Each run's end, its losses and how each resume was audited (from Postgres)."""
    return stack.rows(
        "SELECT r.id, r.status, r.lost_count, r.attempt, r.claimed_by, r.created_at, "
        "r.started_at, r.finished_at, "
        "(SELECT count(*) FROM audit_events a WHERE a.run_id = r.id "
        " AND a.kind = 'agent.run.lost') AS claimed, "
        "(SELECT count(*) FROM audit_events a WHERE a.run_id = r.id "
        " AND a.kind = 'agent.run.crash_resumed') AS crash_resumed, "
        "(SELECT count(*) FROM audit_events a WHERE a.run_id = r.id "
        " AND a.kind = 'agent.run.store_fault') AS store_faulted "
        "FROM runs r WHERE r.id = ANY(CAST(:ids AS uuid[]))",
        ids=runs,
    )
