"""`liyagent`: make seal keys, migrate, start and watch runs, workflows and jobs, decide
approvals, stop runs, call a tool ad hoc, inspect a run, serve the front and metrics, run
workers, beat and Flower, the demo.

Exit codes scripts can rely on: 0 ok, 1 operational failure (a run failed, a timeout, no such
run), 2 bad usage or input (nothing was stored), 3 Postgres or Redis cannot be reached.

An operator types these all day, so a command imports only what it uses: the parser names every
command from the table below without importing any, then imports the chosen command's module
(its options and its handler), which imports the engine's parts it needs
(tests/unit/cli/test_cli_imports.py holds each command to that).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from liyagent import own_modules
from liyagent.cli.common import FAILED, OK, UNREACHABLE, USAGE, CliError, postgres_error

__all__ = ["FAILED", "OK", "UNREACHABLE", "USAGE", "CliError", "build_parser", "main"]

DESCRIPTION = (
    "Durable LLM agent runs: seal keys, migrations, runs, workflows, jobs, approvals, stops, "
    "ad hoc calls, status, inspect, the app front, metrics, workers, beat, Flower, the demo and "
    "the kill trials."
)


@dataclass(frozen=True)
class Command:
    """One sub-command: its name, its one line in `liyagent --help`, and the module that holds
    its options (`ARGUMENTS[name]`) and handler. `passthrough`: Celery's own command, whose
    every argument goes to Celery unparsed (`run(name, argv)` in its module)."""

    name: str
    module: str
    help: str
    passthrough: bool = False


COMMANDS = (
    Command("keys", "liyagent.cli.admin", "seal keys"),
    Command("db", "liyagent.cli.admin", "database schema"),
    Command(
        "run", "liyagent.cli.runs", "start an agent's run (a catalog agent, or a scripted one)"
    ),
    Command(
        "workflow",
        "liyagent.cli.runs",
        "start a workflow run (a declared Python workflow, or a JSON step graph)",
    ),
    Command("job", "liyagent.cli.runs", "queue a background job"),
    Command("watch", "liyagent.cli.watch", "follow a run's events live until it ends"),
    Command("status", "liyagent.cli.reads", "one run, or the most recent runs"),
    Command("inspect", "liyagent.cli.reads", "everything recorded about one run"),
    Command("approvals", "liyagent.cli.ops", "a run's approval requests"),
    Command("approve", "liyagent.cli.ops", "approve a held call (it is made)"),
    Command("deny", "liyagent.cli.ops", "deny a held call (it is not made; the model is told)"),
    Command("signal", "liyagent.cli.ops", "send a run a signal (taken exactly once)"),
    Command("event", "liyagent.cli.ops", "publish an event to the workflows that wait for it"),
    Command("stop", "liyagent.cli.ops", "stop a run, or every run of an agent; or lift a stop"),
    Command(
        "erase",
        "liyagent.cli.ops",
        "erase a run's content (or an owner's runs), keep a tombstone",
    ),
    Command("budget", "liyagent.cli.budget", "raise a run's budget; set an agent's or tenant's"),
    Command("call", "liyagent.cli.ops", "call a tool now, outside any run, with a fresh key"),
    Command("retention", "liyagent.cli.retention", "delete finished runs past their keep"),
    Command("usage", "liyagent.cli.usage", "tokens and cost by agent, tenant or day"),
    Command(
        "deploy",
        "liyagent.cli.deploy",
        "before a deploy: which live runs the new code would not serve as they started",
    ),
    Command("serve", "liyagent.cli.serve", "serve the HTTP app front (webhooks, runs, approvals)"),
    Command(
        "metrics",
        "liyagent.cli.serve",
        "Prometheus metrics, read from Postgres and Redis at each scrape",
    ),
    Command(
        "worker",
        "liyagent.cli.workers",
        "run a worker (celery -A liyagent.worker worker; Celery's options)",
        passthrough=True,
    ),
    Command(
        "beat",
        "liyagent.cli.workers",
        "run beat (celery -A liyagent.worker beat; Celery's options)",
        passthrough=True,
    ),
    Command(
        "flower",
        "liyagent.cli.workers",
        "run Flower (celery -A liyagent.worker flower; give it --basic-auth)",
        passthrough=True,
    ),
    Command("demo", "liyagent.cli.demo", "the crash-resume demo: a worker SIGKILLed mid-run"),
    Command(
        "trials",
        "liyagent.cli.trials",
        "the kill trials: victim workers SIGKILLed mid-run, judged from the records",
    ),
)
_BY_NAME = {c.name: c for c in COMMANDS}


def _chosen(argv: Sequence[str]) -> Command | None:
    """The command argv names: its first word that is not an option (`liyagent` itself takes
    only -h), or None (no command, or an unknown one: argparse says so)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return None if word is None else _BY_NAME.get(word)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser: one sub-command per task. Only the command `argv` names has its
    options (its module imported); `argv` None: every command has them (for docs and tests)."""
    chosen = None if argv is None else _chosen(argv)
    parser = argparse.ArgumentParser(prog="liyagent", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, add_help=not command.passthrough)
        if command.passthrough:
            p.add_argument("celery_args", nargs=argparse.REMAINDER, help="Celery's options")
        elif argv is None or command is chosen:
            arguments = importlib.import_module(command.module).ARGUMENTS[command.name]
            arguments(p)
    return parser


# Each failure a command may raise that is the user's to fix, by where its class is defined,
# with the exit code it means. Looked up among the modules already imported: a class whose
# module the command never imported cannot have been raised, so telling costs no import
# (tests/unit/cli/test_cli_imports.py checks every name here is an exception class).
_USAGE = (
    ("runtime.base.refused", "BadRequest"),
    ("runtime.base.config", "ConfigError"),
    ("runtime.models.scripted", "ScriptError"),
    ("runtime.durable.workflow_spec", "WorkflowError"),
    ("runtime.ops.adhoc", "UnknownTool"),
    ("sqlalchemy.exc", "ArgumentError"),
    ("liyagent.own_modules", "ForeignModule"),
    ("runtime.base.extras", "MissingExtra"),
)
_REDIS_DOWN = (("redis.exceptions", "ConnectionError"), ("redis.exceptions", "TimeoutError"))


def _raised(exc: BaseException, *kinds: tuple[str, str]) -> bool:
    """Whether `exc` is one of `kinds` (module, class name), among the modules imported."""
    return any(
        isinstance(exc, getattr(sys.modules[module], name))
        for module, name in kinds
        if module in sys.modules
    )


def _classify(exc: BaseException) -> CliError | None:
    """Map an exception to the message and exit code the user sees, or None if unexpected."""
    if isinstance(exc, CliError):
        return exc
    if _raised(exc, *_USAGE):
        return CliError(str(exc), USAGE)
    if _raised(exc, ("runtime.toolbox.tools", "ToolDeclarationError")):
        # A tool module or MCP server that does not load.
        return CliError(f"{exc}; nothing was stored", USAGE)
    if _raised(exc, ("runtime.toolbox.tools", "ToolError")):
        # Only raised before a call is sent (a kind made by runs).
        return CliError(f"{exc}; nothing was sent", USAGE)
    if _raised(exc, ("store.rows", "RunNotFound")):
        return CliError(str(exc), FAILED)
    return _unreachable(exc)


def _unreachable(exc: BaseException) -> CliError | None:
    """Postgres, Redis or the broker failed (or the schema is missing): what to do."""
    if _raised(exc, ("sqlalchemy.exc", "OperationalError")):
        from runtime.base.settings import get_settings

        return postgres_error(exc, get_settings().database_url)
    if _raised(exc, ("sqlalchemy.exc", "ProgrammingError")):
        from runtime.recovery.outage import schema_problem  # a worker refusing to start says it

        return CliError(schema_problem(exc), FAILED)
    if _raised(exc, *_REDIS_DOWN):
        from runtime.base.redis_clients import RedisTarget
        from runtime.base.settings import get_settings

        return CliError(
            f"cannot reach Redis at {RedisTarget.of(get_settings()).describe()} ({exc}); "
            "start it or set LIYAGENT_REDIS_URL",
            UNREACHABLE,
        )
    if _raised(exc, ("kombu.exceptions", "OperationalError")):
        return CliError(f"cannot publish to the broker ({exc}); check Redis", UNREACHABLE)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (argparse itself exits 2 on bad usage)."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        # This process loads liyagent's engine, never a team's module of the same name.
        own_modules.pin()
    except own_modules.ForeignModule as exc:
        print(f"liyagent: error: {exc}", file=sys.stderr)
        return USAGE
    chosen = _chosen(words)
    if chosen is not None and chosen.passthrough and words[0] == chosen.name:
        # Celery's own command: every argument is Celery's, and its logs are the worker's.
        run: Callable[[str, list[str]], int] = importlib.import_module(chosen.module).run
        return run(chosen.name, words[1:])
    args = build_parser(words).parse_args(words)
    from runtime.base import logs

    logs.configure(level=_quiet_level())
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        error = _classify(exc)
        if error is None:
            raise
        print(f"liyagent: error: {error}", file=sys.stderr)
        return error.code


def _quiet_level() -> str:
    """Engine logs on a terminal are noise for a CLI: warnings only unless asked for more."""
    return os.environ.get("LIYAGENT_LOG_LEVEL") or "WARNING"


if __name__ == "__main__":
    sys.exit(main())
