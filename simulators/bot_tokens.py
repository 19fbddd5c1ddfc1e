"""The Bot Framework token endpoint's state in Postgres: the bots registered with it and the
opaque tokens it issued, each valid until its expiry by the database clock (the simulated
Connector and Graph check a request's token here)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import Connection, text


@dataclass(frozen=True)
class BotToken:
    """A token the token endpoint issued and that has not expired: whose it is, its row, and
    what it was issued for (scope, and the tenant for a Graph token)."""

    app_id: str
    token_id: int
    scope: str | None = None
    tenant: str | None = None


def upsert_bot(conn: Connection, app_id: str, password_sha256: str, token_ttl_s: float) -> None:
    """Register a bot with the token endpoint (again: its password and token lifetime change)."""
    conn.execute(
        text(
            """INSERT INTO sim.bots (app_id, password_sha256, token_ttl_s)
               VALUES (:app_id, :sha, :ttl)
               ON CONFLICT (app_id) DO UPDATE
               SET password_sha256 = EXCLUDED.password_sha256, token_ttl_s = EXCLUDED.token_ttl_s"""
        ),
        {"app_id": app_id, "sha": password_sha256, "ttl": token_ttl_s},
    )


def bot_password(conn: Connection, app_id: str) -> tuple[str, float] | None:
    """A registered bot's password hash and token lifetime, or None."""
    row = conn.execute(
        text("SELECT password_sha256, token_ttl_s FROM sim.bots WHERE app_id = :a"),
        {"a": app_id},
    ).first()
    return None if row is None else (str(row.password_sha256), float(row.token_ttl_s))


def issue_bot_token(
    conn: Connection, app_id: str, ttl_s: float, scope: str, tenant: str | None = None
) -> tuple[str, int]:
    """A new opaque token for `app_id` and `scope` (in `tenant`), valid for `ttl_s` seconds by
    the database clock."""
    token = secrets.token_urlsafe(32)
    row = conn.execute(
        text(
            """INSERT INTO sim.bot_tokens (token, app_id, expires_at, scope, tenant)
               VALUES (:t, :a, clock_timestamp() + make_interval(secs => :ttl), :s, :tenant)
               RETURNING id"""
        ),
        {"t": token, "a": app_id, "ttl": ttl_s, "s": scope, "tenant": tenant},
    ).one()
    return token, int(row.id)


def valid_bot_token(conn: Connection, token: str) -> BotToken | None:
    """The bot a token was issued to, if the token exists and has not expired."""
    row = conn.execute(
        text(
            """SELECT id, app_id, scope, tenant FROM sim.bot_tokens
               WHERE token = :t AND expires_at > clock_timestamp()"""
        ),
        {"t": token},
    ).first()
    if row is None:
        return None
    return BotToken(str(row.app_id), int(row.id), row.scope, row.tenant)


def expire_bot_tokens(conn: Connection, app_id: str) -> int:
    """Expire every token of `app_id` now (a revocation); how many were still valid."""
    result = conn.execute(
        text(
            """UPDATE sim.bot_tokens SET expires_at = clock_timestamp()
               WHERE app_id = :a AND expires_at > clock_timestamp()"""
        ),
        {"a": app_id},
    )
    return int(result.rowcount)
