"""The demo shows no secret in clear: the front's token, Flower's password, the seal key and a
database password are printed masked, and kept in a file of mode 0600 in its log directory
that a shell can source (issue 31 item 9)."""

from __future__ import annotations

import io
import secrets
import stat
import subprocess
from pathlib import Path

from rich.console import Console

from liyagent.demo import DemoState, inspect_hint, keep_secrets, say_front_and_flower
from liyagent.local.backends import Backends
from liyagent.local.figures import Figures, RunLine
from liyagent.local.secret_file import masked, url_shown
from runtime.base.sealing import new_key_entry

DB_PASSWORD = "pg-" + secrets.token_urlsafe(12)


def _state(tmp_path: Path) -> DemoState:
    backends = Backends(
        database_url=f"postgresql+psycopg://demo:{DB_PASSWORD}@127.0.0.1:5432/liyagent_demo",
        namespace="demo:0123456789ab:",
    )
    state = DemoState(log_dir=tmp_path, backends=backends)
    state.seal_keys = new_key_entry("demo")
    state.front_url, state.flower_url = "http://127.0.0.1:8000", "http://127.0.0.1:5555"
    return state


def _resumed_once() -> Figures:
    line = RunLine(
        id="6f1c2a9e-0000-4000-8000-000000000001",
        status="succeeded",
        attempt=2,
        lost_count=1,
        step=3,
        in_flight_at_kill=True,
        recovery_s=1.5,
        failure_reason=None,
        resume=("resent",),
    )
    return Figures([line], {}, {}, {}, {})


def test_the_demo_prints_its_secrets_masked_and_keeps_them_in_a_private_file(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path)
    token = secrets.token_urlsafe(24)
    path = keep_secrets(state, token)
    console = Console(file=io.StringIO(), width=400, highlight=False)
    say_front_and_flower(state, token, console)
    inspect_hint(state, _resumed_once(), console)
    printed = console.file.getvalue()  # type: ignore[attr-defined]

    seal_key = state.seal_keys.split(":", 1)[1]
    for secret in (token, state.flower_password, state.seal_keys, seal_key, DB_PASSWORD):
        assert secret not in printed, printed
    assert masked(token) in printed and f"{token[:4]}… (32 characters)" in printed
    assert masked(state.flower_password) in printed
    assert str(path) in printed and path.parent == tmp_path
    assert f". {path}; " in printed and "inspect 6f1c2a9e-0000-4000-8000-000000000001" in printed

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # What the hint sources sets every secret exactly.
    shown = subprocess.run(
        ["sh", "-c", f'set -a; . "{path}"; printf "%s|%s|%s|%s" "$LIYAGENT_FRONT_TOKEN" '
         '"$LIYAGENT_DEMO_FLOWER_PASSWORD" "$LIYAGENT_SEAL_KEYS" "$LIYAGENT_DATABASE_URL"'],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert shown.split("|") == [
        token,
        state.flower_password,
        state.seal_keys,
        state.backends.database_url,
    ]


def test_a_redis_url_is_shown_without_its_password() -> None:
    assert url_shown("redis://:s3cret@cache:6379/0") == "redis://:***@cache:6379/0"
    assert url_shown("rediss://app:s3cret@cache:6380") == "rediss://app:***@cache:6380"
    assert url_shown("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    sentinels = "sentinel://:pw@s1:26379/0;sentinel://s2:26379"
    assert url_shown(sentinels) == "sentinel://:***@s1:26379/0;sentinel://s2:26379"
