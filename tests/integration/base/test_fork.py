"""A forked child gets fresh pools (runtime/base/process.py): its own services, Postgres engine
and HTTP client, the parent's Redis sockets closed in it (so the parent's death is seen while
the child lives), and the parent's Postgres connections left open (disposed with close=False).
Real processes by os.fork, real Postgres and Redis; a prefork Celery worker's children take the
same path (tests/integration/test_deaths.py)."""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import redis

from runtime import services as runtime_services
from runtime.base.sealing import parse_keys
from runtime.base.settings import Settings
from runtime.sending import http
from runtime.services import Services
from store import db
from tests.support.stack import FAST, RecordingPublisher

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)


def _forked(body: Callable[[], dict[str, Any]]) -> tuple[int, int]:
    """Run `body` in a forked child that writes its JSON answer to a pipe and exits (the read
    end and the child's pid are returned)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            answer = body()
        except BaseException:
            answer = {"error": traceback.format_exc()}
        os.write(write, (json.dumps(answer) + "\n").encode())
        os.close(write)
        os._exit(0)
    os.close(write)
    return read, pid


def _answer(read: int) -> dict[str, Any]:
    with os.fdopen(read) as pipe:
        line = pipe.readline()
    answer: dict[str, Any] = json.loads(line)
    assert "error" not in answer, answer.get("error")
    return answer


def _redis_fds(s: Services) -> list[int]:
    pool = s.redis.connection_pool
    conns = [*pool._available_connections, *pool._in_use_connections]  # type: ignore[attr-defined]
    presence = s.presence._client
    if presence is not None:
        conns += [*presence.connection_pool._available_connections]  # type: ignore[attr-defined]
        if presence.connection is not None:
            conns.append(presence.connection)
    return [c._sock.fileno() for c in conns if getattr(c, "_sock", None) is not None]


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def _backend(s: Services) -> int:
    with s.engine.connect() as conn:
        return int(conn.execute(db.sql("SELECT pg_backend_pid()")).scalar_one())


def test_a_forked_child_gets_fresh_pools_and_leaves_the_parents(
    db_url: str, namespace: str, servers: tuple[str, str], seal_keys: str
) -> None:
    settings = Settings(
        database_url=db_url, redis_url=servers[1], namespace=namespace, timings=FAST
    )

    def make() -> Services:
        return runtime_services.build(settings, RecordingPublisher(), sealer=parse_keys(seal_keys))

    def parent() -> dict[str, Any]:
        # This process's state was reset at its own fork: everything here is built afresh.
        s = runtime_services.for_process(make)
        s.presence.start()
        s.redis.ping()
        backend, client = _backend(s), http.shared_client()
        fds = _redis_fds(s)

        def child() -> dict[str, Any]:
            closed = [_closed(fd) for fd in fds]  # before the child opens anything of its own
            mine = runtime_services.for_process(make)
            mine.redis.ping()
            return {
                "closed": closed,
                "new_services": mine is not s,
                "new_engine": mine.engine is not s.engine and db.engine_for(db_url) is mine.engine,
                "new_client": http.shared_client() is not client,
                "backend": _backend(mine),
            }

        read, pid = _forked(child)
        seen = _answer(read)
        os.waitpid(pid, 0)
        # The parent's own connections were left to it: same backend, presence still up.
        seen |= {"parent_backend": backend, "backend_after": _backend(s), "up": s.presence.up}
        return seen

    read, pid = _forked(parent)
    seen = _answer(read)
    os.waitpid(pid, 0)
    assert seen["closed"] and all(seen["closed"]), seen
    assert seen["new_services"] and seen["new_engine"] and seen["new_client"], seen
    assert seen["backend"] != seen["parent_backend"] == seen["backend_after"], seen
    assert seen["up"], seen


def test_the_parents_death_is_seen_while_its_child_lives(
    db_url: str, namespace: str, servers: tuple[str, str], seal_keys: str
) -> None:
    """The parent's presence connection closes when the parent dies, though a child it forked
    lives on: the child closed its copy of the socket at the fork."""
    settings = Settings(
        database_url=db_url, redis_url=servers[1], namespace=namespace, timings=FAST
    )

    def parent() -> dict[str, Any]:
        s = runtime_services.for_process(
            lambda: runtime_services.build(
                settings, RecordingPublisher(), sealer=parse_keys(seal_keys)
            )
        )
        s.presence.start()
        child = os.fork()
        if child == 0:  # lives on, holding whatever it inherited
            time.sleep(60)
            os._exit(0)
        return {"connection": s.presence.connection_id, "child": child}

    read, pid = _forked(parent)
    seen = _answer(read)
    os.waitpid(pid, 0)  # the parent is dead; its child sleeps
    admin = redis.Redis.from_url(servers[1])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ids = {int(c["id"]) for c in admin.client_list()}
            if seen["connection"] not in ids:
                break
            time.sleep(0.05)
        assert seen["connection"] not in ids, "the dead parent's presence connection lives on"
    finally:
        os.kill(seen["child"], signal.SIGKILL)
        admin.close()
