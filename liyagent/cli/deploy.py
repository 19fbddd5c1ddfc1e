"""`liyagent deploy check`: run with the new code, before a rolling deploy; lists every run in
flight, waiting or queued that this code would not serve as it started, with why, and exits 1
if any would fail (`--strict`: or drift). The judging is runtime/ops/deploy_check.py's."""

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


def _deploy(deploy: argparse.ArgumentParser) -> None:
    """The `deploy check` sub-command."""
    actions = deploy.add_subparsers(dest="action", required=True)
    p = actions.add_parser(
        "check",
        help="which live runs this code would not serve as they started",
        description=(
            "Run with the new code and the new deployment's settings (LIYAGENT_TOOLS, "
            "LIYAGENT_MODEL_PROFILES, LIYAGENT_SEAL_KEYS), against the deployment's Postgres, "
            "before a rolling deploy: every run in flight, waiting or queued that this code "
            "would fail (its definition does not open here, its model endpoint or framework "
            "agent or job kind is not declared) or would continue not as it started (a tool "
            "it was given is gone), with why. Exits 1 if any would fail; with --strict, also "
            "if any would drift."
        ),
    )
    p.add_argument("--strict", action="store_true", help="exit 1 also when a run would only drift")
    add_json(p)
    p.set_defaults(handler=cmd_deploy_check)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"deploy": _deploy}
