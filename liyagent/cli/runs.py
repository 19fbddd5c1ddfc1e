"""`liyagent run`, `workflow` and `job`: start a run of each kind and, with --wait, wait for
its end. Every input is checked before anything is stored (exit 2). `run --agent NAME` starts
a catalog agent (the catalog file's, or one declared in a tool module) with its own model,
tools and system prompt; `--script FILE` plays scripted model steps for any agent name."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from liyagent.cli.common import (
    FAILED,
    OK,
    USAGE,
    CliError,
    add_json,
    add_wait,
    json_file,
    json_object,
    name_list,
    out,
    print_json,
)
from runtime.base.settings import get_settings
from runtime.durable.workflow_spec import WorkflowError, validate_workflow
from runtime.entries.client import BadRequest, Client
from runtime.models.scripted import ScriptError, validate_script
from runtime.toolbox.tools import AgentDef
from store.states import RunStatus


def _client() -> Client:
    """The client, with Redis checked first (exit 3) rather than leave a run for the outbox."""
    from tasks.services import client

    c = client()
    c.s.redis.ping()
    return c


def _load_script(path: str) -> dict[str, Any]:
    """Read and validate a scripted-model file; any problem is bad input (exit 2)."""
    script = json_file(path, "script")
    try:
        validate_script(script)
    except ScriptError as exc:
        raise CliError(f"{path}: {exc}; nothing was stored", USAGE) from None
    if not isinstance(script, dict):  # validate_script guarantees it; narrows the type
        raise CliError(f"{path}: a script is an object", USAGE)
    return script


def _tools(raw: str | None) -> list[str] | None:
    """The --tools list, each name checked against the tools this deployment has."""
    if raw is None:
        return None
    from runtime.services import registry_for

    available = list(registry_for(get_settings()).names())
    return name_list(raw, "--tools", available, "; nothing was stored")


def _check_wait(args: argparse.Namespace) -> None:
    if args.wait and args.timeout <= 0:
        raise CliError("--timeout must be more than 0 seconds; nothing was stored", USAGE)


def finish(c: Client, run_id: str, args: argparse.Namespace) -> int:
    """Print the started run, or wait for it and print how it ended (exit 1 if it failed)."""
    from liyagent.reporting import render_view, view_json

    if not args.wait:
        if args.json:
            print_json(view_json(c.get(run_id)))
        else:
            print(run_id)
        return OK
    try:
        view = c.wait(run_id, timeout_s=args.timeout)
    except TimeoutError as exc:
        if args.json:
            print_json({**view_json(c.get(run_id)), "timed_out": True})
        raise CliError(f"{exc}; check it later with `liyagent status {run_id}`", FAILED) from None
    if args.json:
        print_json(view_json(view))
    else:
        render_view(out(), view)
    if view.status != RunStatus.FAILED:
        return OK
    print(
        f"liyagent: run {run_id} failed: {view.failure_reason}; "
        f"see why with `liyagent inspect {run_id}`",
        file=sys.stderr,
    )
    return FAILED


def _agent(name: str) -> AgentDef:
    """A catalog agent (the catalog file's, or one declared in a tool module); an unknown name
    is bad input (exit 2) listing the agents there are."""
    from liyagent import declared_agent

    try:
        return declared_agent(name)
    except BadRequest as exc:
        raise CliError(f"--agent: {exc}; nothing was stored", USAGE) from None


def cmd_run(args: argparse.Namespace) -> int:
    """Start a run of a catalog agent, or of any agent name with a scripted model (--script);
    with --wait, wait for its end."""
    if not args.input.strip():
        raise CliError("--input must not be empty; nothing was stored", USAGE)
    output: dict[str, Any] | None = None
    if args.script is not None:
        model: dict[str, Any] = {"provider": "scripted", "script": _load_script(args.script)}
        tools, system = _tools(args.tools), None
    else:
        definition = _agent(args.agent)
        model, system = definition.model, definition.system
        tools = definition.tools if args.tools is None else _tools(args.tools)
        output = definition.output_schema()  # its answer a value of its output type
    _check_wait(args)
    c = _client()
    run_id = c.start_run(
        agent=args.agent,
        model=model,
        user_input=args.input,
        tools=tools,
        system=system,
        request_key=args.request_key,
        output=output,
    )
    return finish(c, run_id, args)


def cmd_workflow(args: argparse.Namespace) -> int:
    """Start a workflow run: a declared Python workflow (--name, --params) or a JSON step
    graph from a file (--file); with --wait, wait for its end."""
    if args.file is None:
        return _declared_workflow(args)
    definition = json_file(args.file, "workflow")
    try:
        validate_workflow(definition)
    except WorkflowError as exc:
        raise CliError(f"{args.file}: {exc}; nothing was stored", USAGE) from None
    if not args.name.strip() or not args.input.strip():
        raise CliError("--name and --input must not be empty; nothing was stored", USAGE)
    _check_wait(args)
    c = _client()
    run_id = c.start_workflow(
        name=args.name, workflow=definition, user_input=args.input, request_key=args.request_key
    )
    return finish(c, run_id, args)


def _declared_workflow(args: argparse.Namespace) -> int:
    from runtime.services import registry_for

    known = registry_for(get_settings()).workflows
    if args.name not in known:
        raise CliError(
            f"unknown workflow {args.name!r} (known: {', '.join(sorted(known)) or 'none'}; "
            "declare it with @workflow in a module LIYAGENT_TOOLS names, or give --file for a "
            "JSON step graph); nothing was stored",
            USAGE,
        )
    params = json_object(args.params or "{}", "--params")
    _check_wait(args)
    c = _client()
    run_id = c.start_workflow(workflow=args.name, params=params, request_key=args.request_key)
    return finish(c, run_id, args)


def cmd_job(args: argparse.Namespace) -> int:
    """Queue a background job of a known kind (built in, or declared with @job in a module
    LIYAGENT_TOOLS names); with --wait, wait for its end."""
    from runtime.services import registry_for

    known = registry_for(get_settings()).jobs
    if args.kind not in known:
        raise CliError(
            f"unknown job kind {args.kind!r}; known: {', '.join(sorted(known))}; "
            "nothing was stored",
            USAGE,
        )
    params = json_object(args.params, "--params")
    _check_wait(args)
    c = _client()
    run_id = c.start_job(kind=args.kind, params=params, request_key=args.request_key)
    return finish(c, run_id, args)


def _run(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--agent",
        required=True,
        help="the agent: one in the catalog or declared in Python (its model, tools and system "
        "prompt), or any name with --script",
    )
    p.add_argument("--script", metavar="FILE.json", help="play these scripted model steps instead")
    p.add_argument("--input", required=True, metavar="TEXT", help="the user's message")
    p.add_argument("--request-key", help="idempotency key: the same key returns the same run")
    p.add_argument(
        "--tools",
        metavar="a,b",
        help="the tools the run may use (default: the agent's; with --script and no --tools, none)",
    )
    add_wait(p)
    add_json(p)
    p.set_defaults(handler=cmd_run)


def _workflow(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--name",
        required=True,
        help="a declared Python workflow's name; with --file, the JSON graph's (its runs' agent)",
    )
    p.add_argument("--params", metavar="JSON", help="a declared workflow's parameters (object)")
    p.add_argument("--file", metavar="WORKFLOW.json", help="a JSON step graph's definition")
    p.add_argument("--input", default="start", metavar="TEXT", help="its input (default start)")
    p.add_argument("--request-key", help="idempotency key: the same key returns the same run")
    add_wait(p)
    add_json(p)
    p.set_defaults(handler=cmd_workflow)


def _job(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", metavar="KIND", help="e.g. source_sync or classifier_training")
    p.add_argument("--params", required=True, metavar="JSON", help="the job's parameters")
    p.add_argument("--request-key", help="idempotency key: the same key returns the same job")
    add_wait(p)
    add_json(p)
    p.set_defaults(handler=cmd_job)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "run": _run,
    "workflow": _workflow,
    "job": _job,
}
