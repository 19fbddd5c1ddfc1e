"""Reading the stores' URLs from settings: Postgres (libpq's multi-host form included) and
Redis (a single server, or the Sentinels that watch one), each refused with the variable named.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

import sqlalchemy as sa

from runtime.base.config import ConfigError
from store.db import Pooler

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
SENTINEL_SCHEME = "sentinel://"
SENTINEL_PORT = 26379


# libpq's multi-host form, `scheme://[userinfo@]h1:p1,h2:p2/...`: the hosts part holds a comma.
_MULTI_HOST = re.compile(
    r"^(?P<scheme>[^:/]+://)(?P<user>[^@/]*@)?(?P<hosts>[^/?@]*,[^/?@]*)(?P<rest>.*)$"
)


def _hosts_in_query(raw: str) -> str:
    """libpq's multi-host URL (`postgresql://user@h1:p1,h2:p2/db?target_session_attrs=...`)
    in the form SQLAlchemy reads (`postgresql://user@/db?host=h1:p1&host=h2:p2&...`); any
    other URL as it is. ValueError for a port that is not a number."""
    found = _MULTI_HOST.match(raw)
    if found is None:
        return raw
    path, _, query = found["rest"].partition("?")
    listed = [h.strip() for h in found["hosts"].split(",") if h.strip()]
    for host in listed:
        _, colon, port = host.rpartition(":") if not host.endswith("]") else ("", "", "")
        if colon and not port.isdigit():
            raise ValueError(f"port {port!r} of {host!r} is not a number")
    hosts = "&".join(f"host={h}" for h in listed)
    return f"{found['scheme']}{found['user'] or ''}{path or '/'}?{hosts}" + (
        f"&{query}" if query else ""
    )


def database_url(raw: str, name: str = "LIYAGENT_DATABASE_URL") -> str:
    """A Postgres URL for psycopg 3 (`postgresql://` and `postgres://` are read as
    `postgresql+psycopg://`; libpq's multi-host form `h1:p1,h2:p2` is kept as its list of
    hosts, tried in order); anything else is a ConfigError naming the variable or option."""
    try:
        url = sa.make_url(_hosts_in_query(raw))
    except (sa.exc.ArgumentError, ValueError):
        raise ConfigError(
            f"{name}={raw[:60]!r} is not a database URL; use "
            "postgresql+psycopg://user[:password]@host[:port]/database"
        ) from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.drivername != "postgresql+psycopg":
        raise ConfigError(
            f"{name}: {url.drivername!r} is not supported; liyagent runs on PostgreSQL through "
            "psycopg 3: use postgresql+psycopg://user[:password]@host[:port]/database"
        )
    return url.render_as_string(hide_password=False)


def database_pooler(raw: str, name: str = "LIYAGENT_DATABASE_POOLER") -> Pooler:
    """What stands between the processes and Postgres: `pgbouncer` (a pooler, transaction
    pooling included), or nothing (unset or `none`); anything else is a ConfigError naming the
    variable."""
    value = raw.strip().lower() or Pooler.NONE.value
    try:
        return Pooler(value)
    except ValueError:
        raise ConfigError(
            f"{name}={raw[:60]!r}: use pgbouncer (LIYAGENT_DATABASE_URL goes through PgBouncer) "
            "or none (it names the server itself)"
        ) from None


def redis_url(raw: str, name: str = "LIYAGENT_REDIS_URL") -> str:
    """A Redis URL redis-py can open, or a list of Sentinels (`sentinel_url`); anything else is
    a ConfigError naming the variable."""
    if raw.startswith(SENTINEL_SCHEME):
        sentinel_url(raw, name)
        return raw
    if not raw.startswith(REDIS_SCHEMES):
        raise ConfigError(
            f"{name}={raw[:60]!r} is not a Redis URL; use redis://host:port/db "
            "(or rediss:// for TLS, unix:///path/to/socket, or "
            "sentinel://host:26379;sentinel://host2:26379 with LIYAGENT_REDIS_MASTER)"
        )
    return raw


@dataclass(frozen=True)
class SentinelUrl:
    """The Sentinels a `sentinel://h1:26379;sentinel://h2:26379/db` URL lists (kombu's form),
    and the database, user and password of the master they name (from its first entry)."""

    hosts: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None


def sentinel_url(raw: str, name: str = "LIYAGENT_REDIS_URL") -> SentinelUrl:
    """Parse a Sentinel URL; a malformed entry is a ConfigError naming the variable."""
    hosts: list[tuple[str, int]] = []
    first: urllib.parse.SplitResult | None = None
    first_db = 0
    for entry in filter(None, (p.strip() for p in raw.split(";"))):
        bad = ConfigError(
            f"{name}: {entry[:60]!r} is not a Sentinel; each entry, separated by ';', is "
            "sentinel://host[:port] (the first may add user:password@ and /db)"
        )
        if not entry.startswith(SENTINEL_SCHEME):
            raise bad
        try:
            part = urllib.parse.urlsplit(entry)
            host, port = part.hostname, part.port or SENTINEL_PORT
            db = int(part.path.strip("/") or 0) if first is None else 0
        except ValueError:
            raise bad from None
        if not host:
            raise bad
        hosts.append((host, port))
        if first is None:
            first, first_db = part, db
    if first is None:
        raise ConfigError(f"{name}={raw[:60]!r} lists no Sentinel")
    return SentinelUrl(
        hosts=tuple(hosts),
        db=first_db,
        username=urllib.parse.unquote(first.username) if first.username else None,
        password=urllib.parse.unquote(first.password) if first.password else None,
    )


def redis_master(url: str, raw: str, name: str = "LIYAGENT_REDIS_MASTER") -> str:
    """The name of the master the Sentinels of `url` watch: required with a Sentinel URL,
    refused without one (it would be silently ignored)."""
    master = raw.strip()
    if url.startswith(SENTINEL_SCHEME) and not master:
        raise ConfigError(
            f"LIYAGENT_REDIS_URL names Sentinels but {name} is not set: set it to the name "
            "of the master they watch (the name in their `sentinel monitor` line)"
        )
    if master and not url.startswith(SENTINEL_SCHEME):
        raise ConfigError(
            f"{name}={master!r} is set but LIYAGENT_REDIS_URL is not a sentinel:// URL: "
            "list the Sentinels there, or unset it"
        )
    if any(c.isspace() for c in master):
        raise ConfigError(f"{name}={master!r}: a master name has no spaces")
    return master
