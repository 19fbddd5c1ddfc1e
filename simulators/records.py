"""What the simulators recorded: every request they received with the status they answered,
and the counts a harness reads (requests by vendor, method, key or run; rows per idempotency key
of each entity, where more than one means a duplicate write)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection, text

from simulators.store import json_param, where_clause


@dataclass(frozen=True)
class RequestRecord:
    """One received HTTP request and the status the simulator answered it with."""

    vendor: str
    method: str
    path: str
    idem_key: str | None
    run_id: str | None
    attempt: int | None
    body: Any
    status: int
    deduped: bool
    call: str | None = None
    # A model's answer: the usage it reported (prompt and completion tokens).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Of its prompt tokens, those it reported read from its prompt cache.
    cached_tokens: int | None = None


def record_request(conn: Connection, record: RequestRecord) -> int:
    """Write the record of one received request; returns its id."""
    sql = """INSERT INTO sim.requests
             (vendor, method, path, idem_key, run_id, attempt, body, status, deduped, call,
              prompt_tokens, completion_tokens, cached_tokens)
             VALUES (:vendor, :method, :path, :idem_key, :run_id, :attempt,
                     CAST(:body AS jsonb), :status, :deduped, :call,
                     :prompt_tokens, :completion_tokens, :cached_tokens) RETURNING id"""
    params = {**asdict(record), "body": json_param(record.body)}
    return int(conn.execute(text(sql), params).scalar_one())


def count_requests(
    conn: Connection,
    vendor: str | None = None,
    method: str | None = None,
    idem_key: str | None = None,
    run_id: str | None = None,
) -> int:
    """How many requests the simulators recorded, optionally narrowed by vendor/method/key/run."""
    filters = {"vendor": vendor, "method": method, "idem_key": idem_key, "run_id": run_id}
    where, params = where_clause(filters)
    return int(
        conn.execute(text(f"SELECT count(*) FROM sim.requests {where}"), params).scalar_one()
    )


def _count_by_key(conn: Connection, table: str, column: str = "idem_key") -> dict[str, int]:
    """Rows per non-null ``column`` value (the idempotency key by default) in an entity table."""
    sql = f"SELECT {column}, count(*) FROM sim.{table} WHERE {column} IS NOT NULL GROUP BY {column}"
    return {str(key): int(n) for key, n in conn.execute(text(sql))}


def incidents_by_key(conn: Connection) -> dict[str, int]:
    """How many incident rows exist per idempotency key (more than 1 means a duplicate)."""
    return _count_by_key(conn, "incidents")


def comments_by_key(conn: Connection) -> dict[str, int]:
    """How many comment rows exist per idempotency key."""
    return _count_by_key(conn, "comments")


def chat_replies_by_key(conn: Connection) -> dict[str, int]:
    """How many chat reply rows exist per idempotency key."""
    return _count_by_key(conn, "chat_replies")


def notifications_by_key(conn: Connection) -> dict[str, int]:
    """How many notification rows exist per idempotency key (more than 1 means a duplicate)."""
    return _count_by_key(conn, "notifications")


def a2a_tasks_by_id(conn: Connection) -> dict[str, int]:
    """How many task rows the remote agent holds per client task id (more than 1: a duplicate)."""
    return _count_by_key(conn, "a2a_tasks", "task_id")


def connector_posts_by_key(conn: Connection) -> dict[str, int]:
    """How many Bot Connector posts exist per idempotency key (more than 1: posted twice)."""
    return _count_by_key(conn, "connector_activities")


def fine_tunes_by_key(conn: Connection) -> dict[str, int]:
    """How many fine-tune jobs exist per idempotency key (more than 1 means a duplicate)."""
    return _count_by_key(conn, "fine_tunes")
