"""Entry points in SQL: landing a run's end on where it came from, and handing its answer on.

Each entry kind with a row of its own keeps its statements in its store module (`store/a2a.py`,
`store/cron.py`, `store/teams.py`): the link inserted with a new run (`store.entry_links`) and
the CTE its end lands with (`ENDS`), riding in the run's own statements, so a run's answer or
failure reaches its A2A task, cron record and Teams inbox row exactly when the run ends, and
once.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from store.a2a import a2a_end
from store.cron import cron_end
from store.db import sql
from store.entry_links import EntryEnd
from store.rows import FencedOut
from store.teams import teams_end
from store.usage import StepUsage, usage_params


class EntryKind(StrEnum):
    """The core's own kinds of run (`runs.entry_kind`): the client API's and the engine's.
    Every other kind is the name of a registered entry point (`runtime.core.entry`, the
    `liyagent.entries` group: webhook, ticket_event, copilot, cron, a2a, teams), said by its
    module, never added here."""

    PLAIN = "plain"  # the client API's default (`Client.start_run`)
    MANAGED = "managed"  # the client API, for an app that manages the run's approvals
    PLAYGROUND = "playground"  # the client API, from a playground
    RESUME = "resume"  # the client API, a run started again by the app
    DELEGATION = "delegation"  # a sub-agent run a parent run's tool call started (core)
    JOB = "job"  # a background job (core)


# Every entry kind with a row of its own, whose end lands there in the ending statement: each
# kind's store module supplies its CTE (`EntryEnd`); a new such kind is listed here.
ENDS: tuple[EntryEnd, ...] = (a2a_end, cron_end, teams_end)


def ends_cte(source: str, *, success: bool, outcome_sql: str, where: str = "TRUE") -> str:
    """CTEs (to append after `source`) landing the run's end on its entry points (`ENDS`)."""
    return "".join(
        ",\n    " + end(source, success=success, outcome_sql=outcome_sql, where=where)
        for end in ENDS
    )


def deliver(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    text: str,
    *,
    retention_s: int,
    sealed_answer: bytes | None = None,
    reply: dict[str, Any] | None = None,
    usage: StepUsage | None = None,
) -> None:
    """Hand the answer on, once, for the owning attempt only (I3): the run is succeeded, the
    answer is on its transcript and its entry points (A2A task, cron record, Teams inbox row
    with the posted `reply`), and it is kept sealed for `retention_s` more.

    With `sealed_answer`, a running run's answer is stored in this same statement (an answer
    that lives only in Postgres: no moment between storing and handing on to crash in);
    without, the answer an earlier statement stored (`answered`, handed on outside first).
    The `usage` of the step that gave a stored answer is written with it (store/usage.py)."""
    row = conn.execute(
        sql(
            f"""
            WITH d AS (
                UPDATE runs SET status = 'succeeded',
                       answer = coalesce(CAST(:answer AS bytea), answer),
                       answered_at = CASE WHEN CAST(:answer AS bytea) IS NULL THEN answered_at
                                          ELSE now() END,
                       finished_at = now(), updated_at = now(),
                       answer_expires_at = now() + make_interval(secs => :retention),
                       answer_input_tokens = CASE WHEN CAST(:answer AS bytea) IS NULL
                           THEN answer_input_tokens ELSE CAST(:input_tokens AS integer) END,
                       answer_output_tokens = CASE WHEN CAST(:answer AS bytea) IS NULL
                           THEN answer_output_tokens ELSE CAST(:output_tokens AS integer) END,
                       answer_cached_tokens = CASE WHEN CAST(:answer AS bytea) IS NULL
                           THEN answer_cached_tokens ELSE CAST(:cached_tokens AS integer) END,
                       answer_model = CASE WHEN CAST(:answer AS bytea) IS NULL
                           THEN answer_model ELSE CAST(:model AS text) END,
                       answer_cost_usd = CASE WHEN CAST(:answer AS bytea) IS NULL
                           THEN answer_cost_usd ELSE CAST(:cost_usd AS numeric) END
                WHERE id = :run_id AND attempt = :attempt
                  AND status = CASE WHEN CAST(:answer AS bytea) IS NULL THEN 'answered'
                                    ELSE 'running' END
                RETURNING id),
            t AS (
                INSERT INTO transcript_messages (run_id, role, content)
                SELECT id, 'assistant', :text FROM d)
            {ends_cte("d", success=True, outcome_sql=":text")}
            SELECT id FROM d
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "text": text,
            "answer": sealed_answer,
            "retention": retention_s,
            "reply": json.dumps(reply) if reply is not None else None,
            **usage_params(usage),
        },
    ).first()
    if row is None:
        what = "hand on the answer" if sealed_answer is None else "store and hand on the answer"
        raise FencedOut(run_id, attempt, what)


def purge_answers(conn: sa.Connection, keep_s: int) -> int:
    """Clear the sealed answers of delivered runs that finished more than `keep_s` ago (the
    setting in force, LIYAGENT_ANSWER_RETENTION_S, so a lowered one applies to answers kept
    before; the `answer_expires_at` stamped at delivery is only what the setting said then)."""
    result = conn.execute(
        sql(
            """
            UPDATE runs SET answer = NULL, answer_purged_at = now()
            WHERE status = 'succeeded' AND answer IS NOT NULL
              AND finished_at < now() - make_interval(secs => :keep_s)
            """
        ),
        {"keep_s": keep_s},
    )
    return int(result.rowcount)
