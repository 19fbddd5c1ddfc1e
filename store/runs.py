"""Run lifecycle statements: enqueue, claim, hand back, answer, deliver, fail.

Every change that must happen once is one conditional statement on the run's row; the
`attempt` column is the fencing token (I3, I4). Zero rows matched is returned as None or
raised as `FencedOut`, never ignored.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import sqlalchemy as sa

from store.db import sql, to_json
from store.entries import ends_cte
from store.entry_links import EntryLink
from store.erasure import ERASED_DIGEST
from store.gates import gate_row, gates_of
from store.rows import (
    Attempt,
    Claimed,
    FencedOut,
    QueuedAttempt,
    RequestKeyConflict,
    RunId,
    RunNotFound,
    RunRow,
)
from store.schema import runs
from store.states import ResumeReason, RunKind, RunStatus
from store.tenants import HELD_ON, IN_FLIGHT_SQL
from store.usage import TOTALS_COLUMNS, TOTALS_SQL, StepUsage, UsageTotals, totals_of, usage_params

_RUN_COLUMN_NAMES = tuple(c.name for c in runs.columns)
_RUN_COLUMNS = ", ".join(_RUN_COLUMN_NAMES)


def _run(row: sa.Row[Any]) -> RunRow:
    """The run in a row holding its columns (and perhaps others, as the claim's gates)."""
    fields = {c: row._mapping[c] for c in _RUN_COLUMN_NAMES}
    return RunRow(
        **{**fields, "status": RunStatus(fields["status"]), "kind": RunKind(fields["kind"])}
    )


class Inserted(NamedTuple):
    """What `insert_run` did: the run, whether it is new, and whether it was stored held
    (its tenant at its bound: not to be published until admitted)."""

    run_id: RunId
    created: bool
    held: bool


def insert_run(
    conn: sa.Connection,
    *,
    run_id: str,
    correlation_id: str,
    request_key: str | None,
    agent: str,
    owner: str,
    entry_kind: str,
    definition: bytes,
    user_input: str,
    sealed_checkpoint: bytes,
    kind: str = "agent",
    channel: str = "api",
    run_as: str | None = None,
    parent_run_id: str | None = None,
    resumable: bool = True,
    link: EntryLink | None = None,
    request_digest: str | None = None,
    principal: str | None = None,
    tenant: str | None = None,
    priority: int = 2,
    tenant_limit: int | None = None,
    budget: dict[str, Any] | None = None,
    pin: bytes | None = None,
    on_stop: str | None = None,
) -> Inserted:
    """Insert a queued run with its sealed definition, its input and its sealed step-0
    checkpoint, and its entry link, in one statement; with a request key this principal already
    used, return that run instead (not new), or raise RequestKeyConflict when that run
    was started with another request (its digest differs; a run stored before digests existed
    matches any). Keys are scoped by `principal` (the front's; None inside the deployment):
    another principal's run is never found, so never handed out. With `tenant_limit` (the
    caller holds the tenant's lock, store/tenants.py) a run whose tenant has that many runs in
    flight, or runs held already, is stored held (waiting on `tenant`), not queued: a new run
    never passes held ones; the caller then admits the tenant's held runs into its room."""
    link_sql, link_params = "", dict[str, Any]()
    if link is not None:
        cte, link_params = link.cte()
        link_sql = f",\n            {cte}"
    row = conn.execute(
        sql(
            f"""
            WITH r AS (
                INSERT INTO runs (id, correlation_id, request_key, request_digest, agent, owner,
                                  principal, entry_kind, definition, kind, channel, run_as,
                                  parent_run_id, resumable, input, checkpoint,
                                  checkpoint_attempt, checkpointed_at, tenant, priority,
                                  budget_tokens, budget_usd, pin, on_stop, status,
                                  waiting_on)
                SELECT :id, :correlation_id, :request_key, :request_digest, :agent, :owner,
                       :principal, :entry_kind, :definition, :kind, :channel,
                       :run_as, :parent_run_id, :resumable, :user_input, :sealed, 1, now(),
                       :tenant, :priority, :budget_tokens, :budget_usd, :pin, :on_stop,
                       CASE WHEN held THEN 'waiting' ELSE 'queued' END,
                       CASE WHEN held THEN '{HELD_ON}' END
                FROM (SELECT CAST(:limit AS int) IS NOT NULL AND ((
                        SELECT count(*) FROM runs
                        WHERE tenant = :tenant AND {IN_FLIGHT_SQL}) >= CAST(:limit AS int)
                        OR EXISTS (SELECT 1 FROM runs WHERE tenant = :tenant
                                   AND status = 'waiting' AND waiting_on = '{HELD_ON}'))
                      AS held) h
                ON CONFLICT (request_key, principal) WHERE request_key IS NOT NULL DO NOTHING
                RETURNING id, principal, status),
            held AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, 'agent.run.waiting', 1, 0,
                       jsonb_build_object('waiting_on', '{HELD_ON}',
                                          'tenant', CAST(:tenant AS text),
                                          'limit', CAST(:limit AS int))
                FROM r WHERE status = 'waiting'){link_sql}
            SELECT id, status FROM r
            """
        ),
        {
            **link_params,
            "id": run_id,
            "correlation_id": correlation_id,
            "request_key": request_key,
            "request_digest": request_digest if request_key is not None else None,
            "agent": agent,
            "owner": owner,
            "principal": principal,
            "entry_kind": entry_kind,
            "definition": definition,
            "sealed": sealed_checkpoint,
            "user_input": user_input,
            "kind": kind,
            "channel": channel,
            "run_as": run_as,
            "parent_run_id": parent_run_id,
            "resumable": resumable,
            "on_stop": on_stop,
            "tenant": tenant,
            "priority": priority,
            "limit": tenant_limit,
            **(budget or {"budget_tokens": None, "budget_usd": None}),  # store/budgets.py
            "pin": pin,
        },
    ).first()
    if row is not None:
        return Inserted(RunId(row.id), True, row.status == RunStatus.WAITING)
    existing = conn.execute(
        sql(
            "SELECT id, request_digest FROM runs WHERE request_key = :k "
            "AND principal IS NOT DISTINCT FROM CAST(:p AS text)"
        ),
        {"k": request_key, "p": principal},
    ).first()
    if existing is None:  # pragma: no cover - the conflict above guarantees a row
        raise RunNotFound(f"request key {request_key}")
    stored = existing.request_digest
    if stored is not None and request_digest is not None and stored != request_digest:
        assert request_key is not None
        raise RequestKeyConflict(request_key, existing.id, erased=stored == ERASED_DIGEST)
    return Inserted(RunId(existing.id), False, False)


def get_run(conn: sa.Connection, run_id: str) -> RunRow:
    row = conn.execute(
        sql(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = CAST(:id AS uuid)"), {"id": run_id}
    ).first()
    if row is None:
        raise RunNotFound(run_id)
    return _run(row)


# Sorts before every run id: where a reader paging through runs by id starts.
FIRST_ID = "00000000-0000-0000-0000-000000000000"


def live_runs_after(conn: sa.Connection, after: str, limit: int) -> list[RunRow]:
    """The next `limit` runs in flight, waiting or queued (not yet answered) whose id sorts
    after `after` (`FIRST_ID` first), by id: a reader pages through every live run along the
    primary key, one read a page, holding no lock."""
    rows = conn.execute(
        sql(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE status IN ('queued', 'running', 'waiting') "
            "AND id > CAST(:after AS uuid) ORDER BY id LIMIT :limit"
        ),
        {"after": after, "limit": limit},
    ).all()
    return [_run(row) for row in rows]


def get_run_used(conn: sa.Connection, run_id: str) -> tuple[RunRow, UsageTotals]:
    """The run and its usage summed over its written steps, in one query."""
    row = conn.execute(
        sql(
            f"SELECT r.*, {TOTALS_COLUMNS} FROM runs r {TOTALS_SQL} WHERE r.id = CAST(:id AS uuid)"
        ),
        {"id": run_id},
    ).first()
    if row is None:
        raise RunNotFound(run_id)
    return _run(row), totals_of(row)


def get_run_by_request_key(
    conn: sa.Connection, request_key: str, principal: str | None
) -> RunRow | None:
    """The run `principal` (None: inside the deployment) started with this key, or None."""
    row = conn.execute(
        sql(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE request_key = :k "
            "AND principal IS NOT DISTINCT FROM CAST(:p AS text)"
        ),
        {"k": request_key, "p": principal},
    ).first()
    return None if row is None else _run(row)


def claim_delivery(conn: sa.Connection, run_id: str, attempt: int, holder: str) -> Claimed | None:
    """Take a queued run for this delivery's attempt and count the delivery, in one statement
    (of two deliveries one wins, I4), or record who hands on an answered run's answer (there,
    the lease taken just before is the guard); the run's gates come back with it, read in the
    same statement (I7). None: the message is stale."""
    row = conn.execute(
        sql(
            f"""
            WITH c AS (
                UPDATE runs SET status = CASE WHEN status = 'answered' THEN 'answered'
                                              ELSE 'running' END,
                       deliveries = deliveries + 1,
                       updated_at = now(), started_at = coalesce(started_at, now()),
                       claimed_by = :holder, claimed_at = now()
                WHERE id = :id AND attempt = :attempt AND status IN ('queued', 'answered')
                RETURNING {_RUN_COLUMNS})
            {gates_of("c", also="r.*, ")}
            """
        ),
        {"id": run_id, "attempt": attempt, "holder": holder},
    ).first()
    if row is None:
        return None
    return Claimed(_run(row), gate_row(row))


# The fence every write of a running attempt goes through: it share-locks the run's row only
# while this attempt owns it, so a concurrent claim (an UPDATE of that row) either commits
# first, and the write matches nothing, or waits for the single-statement write to commit (I3).
# A share lock writes no row: the fence costs no row write.
OWNER_CTE = """owner AS (
    SELECT id FROM runs
    WHERE id = :run_id AND attempt = :attempt AND status = 'running'
    FOR SHARE)"""
# The same fence for an attempt that owns its run while running or handing on a stored answer
# (status answered): what any resume, a hand-on included, writes before it goes on (I3).
RESUMING_OWNER_CTE = """owner AS (
    SELECT id FROM runs
    WHERE id = :run_id AND attempt = :attempt AND status IN ('running', 'answered')
    FOR SHARE)"""


def store_answer(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    sealed_answer: bytes,
    usage: StepUsage | None = None,
) -> None:
    """Seal the final answer onto the run (status answered), with the `usage` of the step that
    gave it (store/usage.py), only for the owning attempt (I3)."""
    row = conn.execute(
        sql(
            """
            UPDATE runs SET status = 'answered', answer = :answer, answered_at = now(),
                   updated_at = now(),
                   answer_input_tokens = :input_tokens, answer_output_tokens = :output_tokens,
                   answer_cached_tokens = :cached_tokens, answer_model = :model,
                   answer_cost_usd = :cost_usd
            WHERE id = :run_id AND attempt = :attempt AND status = 'running'
            RETURNING id
            """
        ),
        {"run_id": run_id, "attempt": attempt, "answer": sealed_answer, **usage_params(usage)},
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, "store the answer")


def fail_run(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    *,
    reason: str,
    audit_kind: str,
    detail: dict[str, Any],
    from_statuses: tuple[RunStatus, ...] = (
        RunStatus.RUNNING,
        RunStatus.QUEUED,
        RunStatus.ANSWERED,
    ),
) -> bool:
    """Fail the run for this attempt with the reason told on its transcript and audited, in one
    statement; False if the attempt no longer owns the run."""
    row = conn.execute(
        sql(
            f"""
            WITH f AS (
                UPDATE runs SET status = 'failed', failure_reason = :reason,
                       finished_at = now(), updated_at = now()
                WHERE id = :run_id AND attempt = :attempt AND status = ANY(:statuses)
                RETURNING id, attempt, step),
            t AS (
                INSERT INTO transcript_messages (run_id, role, content)
                SELECT id, 'notice', :notice FROM f),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, :kind, attempt, step, CAST(:detail AS jsonb) FROM f)
            {ends_cte("f", success=False, outcome_sql=":reason")}
            SELECT id FROM f
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "statuses": list(from_statuses),
            "reason": reason,
            "notice": f"This run failed: {reason}",
            "kind": audit_kind,
            "detail": to_json({"reason": reason, **detail}),
        },
    ).first()
    return row is not None


def hand_back(
    conn: sa.Connection,
    run_id: str,
    attempt: int,
    worker: str,
    reason: ResumeReason = ResumeReason.HANDED_BACK,
    yielded_to: str | None = None,
) -> Attempt:
    """Give a running run back to the queue as a new attempt, audited as
    `agent.run.handed_back` with the reason: a warm shutdown (`handed_back`), or a yield of its
    slot to a lost run (`yielded`, `yielded_to` that run). One statement matching only this
    attempt while running (I3); any ask to yield is cleared with it, and the new attempt
    (resumed) is never asked again: no run yields twice."""
    row = conn.execute(
        sql(
            """
            WITH h AS (
                UPDATE runs SET status = 'queued', attempt = attempt + 1, deliveries = 0,
                       resume_reason = :reason, queued_at = now(), updated_at = now(),
                       yield_for = NULL
                WHERE id = :run_id AND attempt = :attempt AND status = 'running'
                RETURNING id, attempt, step, claimed_at),
            a AS (
                INSERT INTO audit_events (run_id, kind, attempt, step, detail)
                SELECT id, 'agent.run.handed_back', attempt, step,
                       CAST(:detail AS jsonb) || jsonb_build_object('claimed_at', claimed_at)
                FROM h)
            SELECT attempt FROM h
            """
        ),
        {
            "run_id": run_id,
            "attempt": attempt,
            "reason": reason.value,
            "detail": to_json(
                {
                    "worker": worker,
                    "reason": reason.value,
                    **({"yielded_to": yielded_to} if yielded_to is not None else {}),
                }
            ),
        },
    ).first()
    if row is None:
        raise FencedOut(run_id, attempt, "hand the run back")
    return Attempt(row.attempt)


def touch_queued_before(conn: sa.Connection, before: Any, limit: int = 500) -> list[QueuedAttempt]:
    """Runs queued since before `before` (a Postgres timestamp), stamped now so that only one
    caller publishes each again: after Redis came back empty, every queued run's message may
    be gone with it. Stamped rows are not matched again, so a caller loops until none are
    left."""
    rows = conn.execute(
        sql(
            """
            UPDATE runs SET queued_at = now()
            WHERE id IN (
                SELECT id FROM runs
                WHERE status = 'queued' AND queued_at < :before
                ORDER BY queued_at
                LIMIT :limit
                FOR UPDATE SKIP LOCKED)
            RETURNING id, attempt, priority
            """
        ),
        {"before": before, "limit": limit},
    ).all()
    return [QueuedAttempt(str(r.id), r.attempt, r.priority) for r in rows]


def db_now(conn: sa.Connection) -> Any:
    """Postgres's clock now (the cut-off `touch_queued_before` compares with)."""
    return conn.execute(sql("SELECT now() AS now")).scalar_one()


def select_live(conn: sa.Connection) -> list[tuple[RunId, Attempt, str | None]]:
    """Every run that should hold a lease now, with who claimed it, for the sweeper's full
    reconcile."""
    rows = conn.execute(
        sql("SELECT id, attempt, claimed_by FROM runs WHERE status IN ('running', 'answered')")
    ).all()
    return [(RunId(r.id), Attempt(r.attempt), r.claimed_by) for r in rows]


def attempt_statuses(
    conn: sa.Connection, run_ids: list[str]
) -> dict[str, tuple[Attempt, RunStatus]]:
    """Where each of these runs stands now: its attempt and status."""
    rows = conn.execute(
        sql("SELECT id, attempt, status FROM runs WHERE id = ANY(CAST(:ids AS uuid[]))"),
        {"ids": run_ids},
    ).all()
    return {r.id: (Attempt(r.attempt), RunStatus(r.status)) for r in rows}


def still_queued(conn: sa.Connection, messages: list[tuple[str, int]]) -> list[QueuedAttempt]:
    """Of these messages (run id, attempt), those whose run is still queued at that attempt
    (one read), with its priority: what may be published again (a duplicate of a message that
    does arrive is dropped by the lease and the claim, I4)."""
    if not messages:
        return []
    rows = conn.execute(
        sql(
            "SELECT id, attempt, priority FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) "
            "AND status = 'queued'"
        ),
        {"ids": [run_id for run_id, _ in messages]},
    ).all()
    now = {str(r.id): (r.attempt, r.priority) for r in rows}
    return [
        QueuedAttempt(r, a, now[r][1])
        for r, a in dict.fromkeys(messages)
        if r in now and now[r][0] == a
    ]


def queued_before(conn: sa.Connection, older_than_ms: int, limit: int) -> list[QueuedAttempt]:
    """Runs queued (their message published) longer ago than the bound, oldest first, at most
    `limit` (partial index `ix_runs_queued_at`): those whose message the broker should hold."""
    rows = conn.execute(
        sql(
            "SELECT id, attempt, priority FROM runs WHERE status = 'queued' "
            "AND queued_at < now() - make_interval(secs => :secs) ORDER BY queued_at LIMIT :limit"
        ),
        {"secs": older_than_ms / 1000.0, "limit": limit},
    ).all()
    return [QueuedAttempt(str(r.id), r.attempt, r.priority) for r in rows]


def touch_stale_queued(
    conn: sa.Connection, older_than_ms: int, limit: int = 500
) -> list[QueuedAttempt]:
    """Runs queued longer than the bound, stamped so that only one sweep republishes them."""
    rows = conn.execute(
        sql(
            """
            UPDATE runs SET queued_at = now()
            WHERE id IN (
                SELECT id FROM runs
                WHERE status = 'queued'
                  AND queued_at < now() - make_interval(secs => :secs)
                ORDER BY queued_at
                LIMIT :limit
                FOR UPDATE SKIP LOCKED)
            RETURNING id, attempt, priority
            """
        ),
        {"secs": older_than_ms / 1000.0, "limit": limit},
    ).all()
    return [QueuedAttempt(str(r.id), r.attempt, r.priority) for r in rows]
