"""What a fresh interpreter imports to run a `liyagent` command: the structural proof that a
command loads only what it needs (tests/unit/cli/test_cli_imports.py,
tests/integration/cli/test_cli_reads.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from liyagent.local.procs import ROOT

ENGINE = {"runtime", "store", "tasks", "front", "simulators", "celeryconfig", "beat_schedule"}
# Libraries no command or import below needs; each costs tens to hundreds of milliseconds.
HEAVY = {
    "celery", "kombu", "pydantic_ai", "agents", "openai", "anthropic", "mcp", "a2a",
    "starlette", "uvicorn", "matplotlib", "alembic", "flower", "jsonschema", "opentelemetry",
}  # fmt: skip
# What the database and the engine's commons cost: none of it for `--help` or `import liyagent`.
BASE = {"sqlalchemy", "psycopg", "redis", "pydantic", "structlog", "rich", "httpx", "cryptography"}


# Runs `liyagent ARGS` (`-m liyagent`, or `-c CODE`) in a fresh interpreter, then writes every
# module it imported to the file $MODULES_OUT, as the interpreter exits (after the command's own
# SystemExit). sys.modules, not `-X importtime`: that report leaves out what importlib imports.
DRIVER = """
import atexit, json, os, runpy, sys
atexit.register(
    lambda: open(os.environ["MODULES_OUT"], "w").write(json.dumps(sorted(sys.modules)))
)
if sys.argv[1] == "-c":
    exec(sys.argv[2])
else:
    sys.argv = ["liyagent", *sys.argv[1:]]
    runpy.run_module("liyagent", run_name="__main__", alter_sys=True)
"""


def imported(*argv: str, env: dict[str, str] | None = None) -> set[str]:
    """Every module a fresh interpreter imports to run `liyagent ARGV` (or `-c CODE`)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "modules.json"
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, *argv],
            cwd=ROOT,
            env={**(os.environ if env is None else env), "MODULES_OUT": str(out)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return set(json.loads(out.read_text()))


def tops(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}
