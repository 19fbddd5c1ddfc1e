"""The HTTP front as a real process (`python -m front`), over a test's stack."""

from __future__ import annotations

from pathlib import Path

from liyagent.local.procs import Proc, python
from tests.support.stack import Stack

TOKEN = "t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def serve_front(stack: Stack, agents_file: str, extra: dict[str, str] | None = None) -> str:
    """Start the front on a free port with the stack's settings and `agents_file`; returns its
    base URL. The stack kills it with its other processes."""
    env = {
        **stack.env,
        "LIYAGENT_FRONT_TOKEN": TOKEN,
        "LIYAGENT_AGENTS_FILE": agents_file,
        **(extra or {}),
    }
    log = Path(stack.tmp) / f"front-{len(stack.procs)}.log"
    proc = Proc("front", python("-m", "front", "--port", "0"), env, log)
    stack.procs.append(proc)
    return proc.wait_for(r"front listening on (http://\S+)", timeout=30).group(1)
