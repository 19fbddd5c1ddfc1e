"""Entry points in SQL: linking a new run to where it came from, and landing its end there.

The fragments here are CTEs that ride in the run's own statements, so a run's answer or failure
reaches its A2A task, cron record and Teams inbox row exactly when the run ends, and once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from store.db import sql
from store.rows import FencedOut
from store.scope import Scope


class EntryKind(StrEnum):
    """Where a run came from (`runs.entry_kind`): each entry point's code is one module of
    `runtime/entries/`, and the engine's own kinds are started by the core."""

    PLAIN = "plain"  # the client API's default (`Client.start_run`)
    MANAGED = "managed"  # the client API, for an app that manages the run's approvals
    PLAYGROUND = "playground"  # the client API, from a playground
    RESUME = "resume"  # the client API, a run started again by the app
    WEBHOOK = "webhook"  # POST /webhooks/{agent}: one run per agent and event id
    TICKET_EVENT = "ticket_event"  # POST /tickets/{id}/events: one run per ticket and event
    COPILOT = "copilot"  # POST /copilot/turns: one run per conversation and turn
    CRON = "cron"  # a catalog cron trigger: one run per trigger and scheduled time
    A2A = "a2a"  # an A2A SendMessage: one run per message, linked to its task
    TEAMS = "teams"  # a Teams activity: one run per inbox row; its reply leaves Postgres
    DELEGATION = "delegation"  # a sub-agent run a parent run's tool call started (core)
    JOB = "job"  # a background job (core)


@dataclass(frozen=True)
class EntryLink:
    """What a new run is linked to: an A2A task id (with its context id and the message that
    created it), a cron trigger and slot, an inbox row."""

    kind: EntryKind  # a2a | cron | teams
    ref: str
    scheduled_at: datetime | None = None
    context_id: str | None = None
    # The A2A message as received (JSON text).
    message: str | None = None

    def cte(self) -> tuple[str, dict[str, Any]]:
        """A CTE inserting the link for the run the `r` CTE inserted."""
        if self.kind == EntryKind.A2A:
            return (
                "link AS (INSERT INTO a2a_tasks (id, run_id, principal, context_id, message) "
                "SELECT :link_ref, id, principal, :link_context, CAST(:link_message AS jsonb) "
                "FROM r)",
                {
                    "link_ref": self.ref,
                    "link_context": self.context_id,
                    "link_message": self.message,
                },
            )
        if self.kind == EntryKind.CRON:
            return (
                "link AS (INSERT INTO cron_runs (trigger, scheduled_at, run_id) "
                "SELECT :link_ref, :link_at, id FROM r)",
                {"link_ref": self.ref, "link_at": self.scheduled_at},
            )
        if self.kind == EntryKind.TEAMS:
            return (
                "link AS (UPDATE teams_inbox SET status = 'running', run_id = r.id FROM r "
                "WHERE teams_inbox.id = CAST(:link_ref AS bigint))",
                {"link_ref": self.ref},
            )
        raise ValueError(f"unknown entry link {self.kind!r}")


def ends_cte(source: str, *, success: bool, outcome_sql: str, where: str = "TRUE") -> str:
    """CTEs (to append after `source`) landing the run's end on its entry points."""
    a2a, cron, teams = (
        ("completed", "succeeded", "replied") if success else ("failed", "failed", "failed")
    )
    reply = ", reply = CAST(:reply AS jsonb), replied_at = now()" if success else ""
    return f""",
    e_a2a AS (
        UPDATE a2a_tasks SET status = '{a2a}', answer = {outcome_sql}, updated_at = now()
        FROM {source} WHERE a2a_tasks.run_id = {source}.id AND {where}),
    e_cron AS (
        UPDATE cron_runs SET status = '{cron}', outcome = {outcome_sql}, recorded_at = now()
        FROM {source} WHERE cron_runs.run_id = {source}.id AND cron_runs.recorded_at IS NULL
          AND {where}),
    e_teams AS (
        UPDATE teams_inbox SET status = '{teams}'{reply}
        FROM {source} WHERE teams_inbox.run_id = {source}.id AND {where})"""


def deliver(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    text: str,
    *,
    retention_s: int,
    sealed_answer: bytes | None = None,
    reply: dict[str, Any] | None = None,
) -> None:
    """Hand the answer on, once, for the owning attempt only (I3): the run is succeeded, the
    answer is on its transcript and its entry points (A2A task, cron record, Teams inbox row
    with the posted `reply`), and it is kept sealed for `retention_s` more.

    With `sealed_answer`, a running run's answer is stored in this same statement (an answer
    that lives only in Postgres: no moment between storing and handing on to crash in);
    without, the answer an earlier statement stored (`answered`, handed on outside first)."""
    row = conn.execute(
        sql(
            f"""
            WITH d AS (
                UPDATE runs SET status = 'succeeded',
                       answer = coalesce(CAST(:answer AS bytea), answer),
                       answered_at = CASE WHEN CAST(:answer AS bytea) IS NULL THEN answered_at
                                          ELSE now() END,
                       finished_at = now(), updated_at = now(),
                       answer_expires_at = now() + make_interval(secs => :retention)
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


# The A2A task state a run stands in (protocol names; the front maps them to its enum): the
# run's end first, then a Stop asked for by CancelTask, then what a live run waits for.
TASK_STATE_SQL = """CASE
    WHEN r.status = 'succeeded' THEN 'completed'
    WHEN r.status = 'failed' AND t.canceled_at IS NOT NULL THEN 'canceled'
    WHEN r.status = 'failed' THEN 'failed'
    WHEN r.status = 'waiting' AND r.waiting_on LIKE 'approval:%' THEN 'auth-required'
    WHEN r.status = 'queued' AND r.started_at IS NULL THEN 'submitted'
    ELSE 'working' END"""

_TASK_SELECT = f"""
    SELECT t.id, t.run_id, t.context_id, t.message, t.answer, t.canceled_at, t.created_at,
           greatest(t.updated_at, r.updated_at) AS updated_at, r.agent, r.status AS run_status,
           r.waiting_on, r.failure_reason, {TASK_STATE_SQL} AS state
    FROM a2a_tasks t JOIN runs r ON r.id = t.run_id"""


@dataclass(frozen=True)
class A2ATask:
    """An A2A task with the state of its run: what GetTask and ListTasks answer from."""

    id: str
    run_id: str
    context_id: str | None
    message: dict[str, Any] | None
    answer: str | None
    canceled_at: datetime | None
    created_at: datetime
    updated_at: datetime
    agent: str
    run_status: str
    waiting_on: str | None
    failure_reason: str | None
    # submitted, working, auth-required, completed, failed or canceled (TASK_STATE_SQL).
    state: str


def get_a2a_task(conn: sa.Connection, task_id: str, scope: Scope) -> A2ATask | None:
    """The A2A task `task_id` as `scope` sees it (ids are unique per principal: the reader's
    own task first, else the first made), with its run's state; None when it sees none."""
    row = conn.execute(
        sql(
            f"{_TASK_SELECT} WHERE t.id = :id AND {scope.sees('t')} "
            f"ORDER BY {scope.own_first('t')}, t.created_at, t.run_id LIMIT 1"
        ),
        {"id": task_id, **scope.params()},
    ).first()
    return None if row is None else A2ATask(**row._mapping)


def list_a2a_tasks(
    conn: sa.Connection,
    *,
    scope: Scope,
    limit: int,
    context_id: str | None = None,
    state: str | None = None,
    updated_after: datetime | None = None,
    before: tuple[datetime, str] | None = None,
) -> tuple[list[A2ATask], int]:
    """A page of the A2A tasks `scope` sees, newest first, after the cursor `before`
    (created_at, id); with the number of those tasks the filters match in all."""
    where = [scope.sees("t"), "(CAST(:ctx AS text) IS NULL OR t.context_id = :ctx)"]
    where.append(f"(CAST(:state AS text) IS NULL OR {TASK_STATE_SQL} = :state)")
    where.append(
        "(CAST(:after AS timestamptz) IS NULL OR greatest(t.updated_at, r.updated_at) > :after)"
    )
    params: dict[str, Any] = {
        "ctx": context_id,
        "state": state,
        "after": updated_after,
        **scope.params(),
    }
    total = conn.execute(
        sql(
            "SELECT count(*) FROM a2a_tasks t JOIN runs r ON r.id = t.run_id WHERE "
            + " AND ".join(where)
        ),
        params,
    ).scalar_one()
    if before is not None:
        where.append("(t.created_at, t.id) < (:b_at, :b_id)")
        params |= {"b_at": before[0], "b_id": before[1]}
    rows = conn.execute(
        sql(
            f"{_TASK_SELECT} WHERE {' AND '.join(where)} "
            "ORDER BY t.created_at DESC, t.id DESC LIMIT :n"
        ),
        {**params, "n": limit},
    ).all()
    return [A2ATask(**r._mapping) for r in rows], int(total)


def mark_a2a_canceled(conn: sa.Connection, run_id: str) -> bool:
    """Record that CancelTask stopped this run's task (once; only while the run has not ended),
    so the run's failure is reported as canceled."""
    row = conn.execute(
        sql(
            """
            UPDATE a2a_tasks SET canceled_at = now(), updated_at = now()
            FROM runs r
            WHERE a2a_tasks.run_id = CAST(:run_id AS uuid) AND r.id = a2a_tasks.run_id
              AND a2a_tasks.canceled_at IS NULL
              AND (r.status NOT IN ('succeeded', 'failed') OR r.failure_reason LIKE 'stopped by%')
            RETURNING a2a_tasks.id
            """
        ),
        {"run_id": run_id},
    ).first()
    return row is not None


def insert_teams_message(
    conn: sa.Connection,
    *,
    message_id: str,
    conversation: str,
    sender_id: str,
    agent: str,
    text: str,
    service_url: str | None = None,
    activity: dict[str, Any] | None = None,
) -> tuple[int, bool]:
    """Put a Teams turn (an activity) in the durable inbox once, by its conversation and
    activity id, with its sender's Entra object id (the run's owner); returns (row id, new)."""
    row = conn.execute(
        sql(
            """
            WITH i AS (
                INSERT INTO teams_inbox
                    (message_id, conversation, sender_id, agent, text, service_url, activity)
                VALUES (:m, :c, :s, :a, :t, :u, CAST(:act AS jsonb))
                ON CONFLICT (conversation, message_id) DO NOTHING RETURNING id)
            SELECT id, true AS new FROM i
            UNION ALL SELECT id, false FROM teams_inbox WHERE conversation = :c
              AND message_id = :m AND NOT EXISTS (SELECT 1 FROM i)
            """
        ),
        {
            "m": message_id,
            "c": conversation,
            "s": sender_id,
            "a": agent,
            "t": text,
            "u": service_url,
            "act": None if activity is None else json.dumps(activity),
        },
    ).one()
    return int(row.id), bool(row.new)


@dataclass(frozen=True)
class TeamsMessage:
    """One inbox row: the activity a turn answers and where its reply goes."""

    id: int
    message_id: str
    conversation: str
    # The sender's Entra object id (the run's owner); None only on a turn stored before 0014
    # whose activity named none, which is never started.
    sender_id: str | None
    agent: str
    text: str
    service_url: str | None
    activity: dict[str, Any] | None


_TEAMS_COLUMNS = "id, message_id, conversation, sender_id, agent, text, service_url, activity"


def select_new_teams_messages(conn: sa.Connection, limit: int = 50) -> list[TeamsMessage]:
    """Inbox rows no turn has taken yet (two intakes reading one row still make one run)."""
    rows = conn.execute(
        sql(f"SELECT {_TEAMS_COLUMNS} FROM teams_inbox WHERE status = 'new' ORDER BY id LIMIT :n"),
        {"n": limit},
    ).all()
    return [TeamsMessage(**r._mapping) for r in rows]


def get_teams_message_of_run(conn: sa.Connection, run_id: str) -> TeamsMessage | None:
    """The inbox row whose turn this run is, or None."""
    row = conn.execute(
        sql(f"SELECT {_TEAMS_COLUMNS} FROM teams_inbox WHERE run_id = CAST(:r AS uuid)"),
        {"r": run_id},
    ).first()
    return None if row is None else TeamsMessage(**row._mapping)
