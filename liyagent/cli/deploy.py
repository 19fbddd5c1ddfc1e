"""`liyagent deploy check`: run with the new code, before a rolling deploy; lists every run in
flight, waiting or queued that this code would not serve as it started, with why, and exits 1
if any would fail (`--strict`: or drift). The judging is runtime/ops/deploy_check.py's.
`liyagent deploy status`: during one, the live runs by the definition version they are pinned
to, and what waits for a worker whose code serves it (runtime/ops/deploy_status.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich.table import Table
from rich.text import Text

from liyagent.cli.common import FAILED, OK, add_json, out, print_json, read_client


def cmd_deploy_check(args: argparse.Namespace) -> int:
    """Judge every live run against this process's code and deployment settings."""
    from runtime.ops.deploy_check import Code, Verdict, check_deploy

    s = read_client().s
    report = check_deploy(s.engine, Code(s.sealer, s.tools, s.model_profiles()))
    fail, drift = report.count(Verdict.FAILS), report.count(Verdict.DRIFTS)
    if args.json:
        print_json(report.to_json())
    else:
        if report.findings:
            table = Table("run", "agent", "status", "verdict", "why", show_edge=False)
            for f in report.findings:
                table.add_row(f.run_id, f.agent, f.status, f.verdict.value, f.why)
            out().print(table)
        out().print(
            Text(
                f"{report.checked} runs in flight, waiting or queued checked against this code: "
                f"{fail} would fail, {drift} would not be served as they started."
            )
        )
    return FAILED if fail or (args.strict and drift) else OK


def cmd_deploy_status(args: argparse.Namespace) -> int:
    """The live runs by definition version, and what waits for which."""
    from runtime.ops.deploy_status import deploy_status

    s = read_client().s
    versions = deploy_status(s.engine, s.sealer)
    if args.json:
        print_json({"versions": [v.to_json() for v in versions]})
        return OK
    table = Table("pinned to", "policy", "agents", "queued", "running", "waiting",
                  "waiting for code that serves it", show_edge=False)  # fmt: skip
    for v in versions:
        table.add_row(
            v.pin,
            v.policy or "-",
            ", ".join(sorted(v.agents)),
            *(str(v.statuses[status]) for status in ("queued", "running", "waiting")),
            str(v.waiting_for_code),
        )
    out().print(table)
    waiting = sum(v.waiting_for_code for v in versions)
    out().print(
        Text(
            f"{sum(v.statuses.total() for v in versions)} live runs over {len(versions)} "
            f"definition versions; {waiting} wait for a worker whose code serves them."
        )
    )
    return OK


def _deploy(deploy: argparse.ArgumentParser) -> None:
    """The `deploy check` and `deploy status` sub-commands."""
    actions = deploy.add_subparsers(dest="action", required=True)
    p = actions.add_parser(
        "check",
        help="which live runs this code would not serve as they started",
        description=(
            "Run with the new code and the new deployment's settings (LIYAGENT_TOOLS, "
            "LIYAGENT_MODEL_PROFILES, LIYAGENT_SEAL_KEYS), against the deployment's Postgres, "
            "before a rolling deploy: every run in flight, waiting or queued that this code "
            "would fail (its definition does not open here, its model endpoint or framework "
            "agent or job kind is not declared, or it is pinned to a tool or output type this "
            "code changed) or would continue not as it started (it follows the latest "
            "definition, or was stored before pins, and a tool it was given is gone), with why. "
            "Exits 1 if any would fail; with --strict, also if any would drift."
        ),
    )
    p.add_argument("--strict", action="store_true", help="exit 1 also when a run would only drift")
    add_json(p)
    p.set_defaults(handler=cmd_deploy_check)
    p = actions.add_parser(
        "status",
        help="the live runs by the definition version they are pinned to",
        description=(
            "During a rolling deploy: every run in flight, waiting or queued, counted under "
            "the definition version it is pinned to (its policy, its agents, its runs by "
            "status), and how many wait for a worker whose code serves their version."
        ),
    )
    add_json(p)
    p.set_defaults(handler=cmd_deploy_status)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"deploy": _deploy}
