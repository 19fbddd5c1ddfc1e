"""`liyagent worker|beat|flower ...`: Celery's own commands on liyagent's app, under a name no
team's module takes (`celery -A liyagent.worker worker|beat|flower ...`, liyagent/worker.py).

Every argument after the command is Celery's, passed on as written (`liyagent worker --help`
is Celery's worker help): `liyagent worker -Q liyagent,liyagent.ops -c 4 -l INFO`. Celery's
global options, which `celery` takes before its command (`--broker`, `--workdir`), have no
place here: liyagent's settings come from `LIYAGENT_*`, and a working directory is the one it
is started in.
"""

from __future__ import annotations

APP = "liyagent.worker"


def celery_argv(command: str, argv: list[str]) -> list[str]:
    """What `celery` is given for `liyagent COMMAND ARGV`."""
    return ["-A", APP, command, *argv]


def run(command: str, argv: list[str]) -> int:
    """Run Celery's `command` on liyagent's app in this process, as `celery` would (its gevent
    or eventlet patches first, as Celery's own entry point applies them); returns its exit
    code."""
    from celery import maybe_patch_concurrency

    args = celery_argv(command, argv)
    if command == "flower":
        from runtime.base.extras import need

        need("flower", "flower")  # Celery's own message would not name the extra
    if command == "worker":
        maybe_patch_concurrency(["celery", *args])
    from celery.bin.celery import celery

    try:
        celery.main(args=args, prog_name="liyagent", auto_envvar_prefix="CELERY")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return 0
