"""Every Redis client the engine opens, from one setting: `LIYAGENT_REDIS_URL`.

A plain URL (`redis://`, `rediss://`, `unix://`) is opened as it is, so a managed endpoint that
fails over behind one name keeps working unchanged. A `sentinel://h1:26379;sentinel://h2:26379`
URL (kombu's form, which the broker reads too) lists Redis Sentinels; with the master's name in
`LIYAGENT_REDIS_MASTER`, each client asks them where the master is whenever it (re)connects,
through redis-py's `Sentinel.master_for`, and so follows the master through a failover.
Connection options (the holder's CLIENT SETNAME, timeouts, retries) apply to the connections
to the master, so the death watch reads the same names in the master's CLIENT LIST.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import redis
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from runtime.base.settings import SENTINEL_SCHEME, ConfigError, Settings, sentinel_url

# The longest a question to one Sentinel may take (a tiny reply): a client whose own timeout
# is longer (the presence connection blocks for seconds) still moves on to the next Sentinel
# soon when one is cut off.
SENTINEL_TIMEOUT_S = 2.0
_SENTINEL_OPTIONS = ("socket_timeout", "socket_connect_timeout")


@dataclass(frozen=True)
class RedisTarget:
    """Where this deployment's Redis is: a URL, and with Sentinels the master's name."""

    url: str
    master: str = ""

    @classmethod
    def of(cls, settings: Settings) -> RedisTarget:
        return cls(settings.redis_url, settings.redis_master)

    @property
    def sentinel(self) -> bool:
        return self.url.startswith(SENTINEL_SCHEME)

    def describe(self) -> str:
        """For messages: the URL, and the master's name when Sentinels find it."""
        return f"master {self.master!r} of the Sentinels {self.url}" if self.sentinel else self.url

    def client(self, **options: Any) -> redis.Redis[bytes]:
        """A new client (its own pool) with redis-py's connection `options`, on the master."""
        if not self.sentinel:
            return redis.Redis.from_url(self.url, **options)
        if not self.master:
            raise ConfigError(
                "LIYAGENT_REDIS_URL names Sentinels but LIYAGENT_REDIS_MASTER is not set"
            )
        single = bool(options.pop("single_connection_client", False))
        sentinels = _sentinels(
            self.url,
            {
                k: min(float(options.get(k) or SENTINEL_TIMEOUT_S), SENTINEL_TIMEOUT_S)
                for k in _SENTINEL_OPTIONS
            },
        )
        parsed = sentinel_url(self.url)
        pool = SentinelConnectionPool(
            self.master,
            sentinels,
            is_master=True,
            db=parsed.db,
            username=parsed.username,
            password=parsed.password,
            **options,
        )
        client: redis.Redis[bytes] = redis.Redis(
            connection_pool=pool, single_connection_client=single
        )
        # The pool is this client's alone: closing the client closes it (redis-py's own
        # from_url does the same; the stubs predate the attribute).
        client.auto_close_connection_pool = True  # type: ignore[attr-defined]
        return client


def client_for(target: RedisTarget | str, **options: Any) -> redis.Redis[bytes]:
    """The one place a Redis client of the engine is built (a bare string is a plain URL)."""
    if isinstance(target, str):
        target = RedisTarget(target)
    return target.client(**options)


_lock = threading.Lock()
_managers: dict[tuple[str, tuple[tuple[str, Any], ...]], Sentinel] = {}


def _sentinels(url: str, options: dict[str, Any]) -> Sentinel:
    """One Sentinel manager per URL and timeouts in this process: the clients of a process
    share its few connections to the Sentinels (redis-py's pools reopen them after a fork)."""
    key = (url, tuple(sorted(options.items())))
    with _lock:
        if key not in _managers:
            parsed = sentinel_url(url)
            _managers[key] = Sentinel(list(parsed.hosts), sentinel_kwargs=dict(options))
        return _managers[key]


def check_reachable(settings: Settings, timeout_s: float = SENTINEL_TIMEOUT_S) -> None:
    """Before a process starts: with Sentinels, that one of them answers and knows the master
    (a ConfigError naming the setting to fix otherwise). A plain URL is not checked here: the
    broker and the engine retry it as they always have."""
    target = RedisTarget.of(settings)
    if not target.sentinel:
        return
    parsed = sentinel_url(target.url)
    where = ", ".join(f"{h}:{p}" for h, p in parsed.hosts)
    manager = Sentinel(
        list(parsed.hosts),
        sentinel_kwargs={"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s},
    )
    try:
        manager.discover_master(target.master)
    except redis.ResponseError as exc:
        raise ConfigError(
            f"LIYAGENT_REDIS_URL: a server at {where} answers but is not a Sentinel "
            f"({str(exc)[:80]}); list the Sentinels' own ports (26379 by default)"
        ) from None
    except MasterNotFoundError as exc:
        if not _any_answers(manager):
            raise ConfigError(
                f"LIYAGENT_REDIS_URL: no Sentinel answers at {where}; start them, or list "
                "reachable ones in LIYAGENT_REDIS_URL"
            ) from None
        raise ConfigError(
            f"LIYAGENT_REDIS_MASTER={target.master!r}: the Sentinels at {where} know no "
            f"healthy master of that name ({str(exc)[:160]}); set it to the name in their "
            "`sentinel monitor` line"
        ) from None
    finally:
        for node in manager.sentinels:
            node.close()


def _any_answers(manager: Sentinel) -> bool:
    for node in manager.sentinels:
        try:
            node.ping()
            return True
        except redis.RedisError:
            continue
    return False
