"""An operator's actions from `liyagent`: list and decide approvals, stop runs, erase runs,
call a tool ad hoc. Bad input exits 2 before anything is stored or sent; a refused action
exits 1."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from rich.text import Text

from liyagent.cli.common import (
    FAILED,
    OK,
    USAGE,
    CliError,
    add_json,
    json_object,
    out,
    print_json,
    read_client,
)
from liyagent.cli.common import who as _who
from runtime.entries.client import (
    AlreadyEnded,
    BadRequest,
    Client,
    NotDecided,
    Stopped,
    parse_agent,
    parse_id,
)
from store.rows import ApprovalRow, RunNotFound


def _client() -> Client:
    from tasks.services import client

    return client()


def cmd_approvals(args: argparse.Namespace) -> int:
    """A run's approval requests: id, tool, status, who decided."""
    from liyagent.reporting import approval_json, render_approvals

    c = read_client()  # a read: never makes a seal key
    run_id = c.resolve_run_id(args.run_id)
    c.get(run_id)  # an unknown run is an error (exit 1), not an empty list
    approvals = c.approvals(run_id)
    if args.json:
        print_json([approval_json(a) for a in approvals])
    else:
        render_approvals(out(), run_id, approvals)
    return OK


def _not_decided(approval_id: str, current: ApprovalRow | None) -> CliError:
    """Why a decision changed nothing: no such approval, or it was decided before (exit 1)."""
    if current is None:
        return CliError(
            f"approval {approval_id} does not exist; list a run's approvals with "
            "`liyagent approvals RUN_ID`",
            FAILED,
        )
    return CliError(
        f"approval {approval_id} of run {current.run_id} was already {current.status} by "
        f"{current.decided_by}; nothing changed (see `liyagent approvals {current.run_id}`)",
        FAILED,
    )


def _decide(args: argparse.Namespace, approve: bool) -> int:
    """Decide one pending approval once; the run waiting on it continues."""
    from liyagent.reporting import approval_json, render_decision

    try:
        approval_id = parse_id(args.approval_id, "approval id")
    except BadRequest:
        raise CliError(
            f"{args.approval_id!r} is not an approval id (a UUID); nothing changed", USAGE
        ) from None
    by = _who(args.by)
    c = _client()
    try:
        row = c.decide(approval_id, approve=approve, by=by, reason=args.reason)
    except NotDecided as exc:
        raise _not_decided(approval_id, exc.current) from None
    if args.json:
        print_json(approval_json(row))
    else:
        render_decision(out(), row)
    return OK


def cmd_approve(args: argparse.Namespace) -> int:
    """Approve a held call: it is made with the approval id as its key."""
    return _decide(args, approve=True)


def cmd_deny(args: argparse.Namespace) -> int:
    """Deny a held call: it is not made, and the run's model is told."""
    return _decide(args, approve=False)


def _stop_run(c: Client, run_id: str, reason: str, by: str) -> Stopped:
    """Stop one run that has not ended (one that has exits 1)."""
    try:
        return c.stop_run(run_id, reason=reason, by=by)
    except AlreadyEnded as exc:
        raise CliError(f"run {run_id} already {exc.status}; nothing to stop", FAILED) from None


def _target(c: Client, args: argparse.Namespace) -> str | None:
    """The run --run names (a full id or a unique prefix), or None for --agent (whose name is
    checked by the rule the front applies too)."""
    if args.agent is not None:
        parse_agent(args.agent)
        return None
    return c.resolve_run_id(args.run)


def cmd_stop(args: argparse.Namespace) -> int:
    """An operator's Stop: every run it covers (a run's children too) fails now.
    With --lift, the Stops standing on the run or agent are lifted instead."""
    from liyagent.reporting import render_stop

    by = _who(args.by)
    if args.lift:
        return _lift(args, by)
    reason = (args.reason or "").strip()
    if not reason:
        raise CliError("--reason must say why; nothing was stored", USAGE)
    c = _client()
    run_id = _target(c, args)
    if run_id is not None:
        done = _stop_run(c, run_id, reason, by)
        target = f"run {run_id}"
    else:
        done = c.stop_agent(args.agent, reason=reason, by=by)
        target = (
            f"agent {args.agent} (its later runs are refused until the stop is lifted with "
            f"`liyagent stop --lift --agent {args.agent}`)"
        )
    if args.json:
        print_json(
            {"run": run_id, "agent": args.agent, "by": by, "reason": reason,
             "stopped_now": done.now}
        )  # fmt: skip
    else:
        render_stop(out(), target, done.now)
    return OK


def _lift(args: argparse.Namespace, by: str) -> int:
    """Lift the Stops standing on a run or an agent (audited); exit 1 when none stood."""
    from liyagent.reporting import render_lift

    c = _client()
    run_id = _target(c, args)
    lifted = c.lift_stop(run_id=run_id, agent=args.agent, by=by, reason=args.reason)
    target = f"run {run_id}" if run_id is not None else f"agent {args.agent}"
    if args.json:
        print_json(
            {"run": run_id, "agent": args.agent, "by": by, "reason": args.reason,
             "lifted": [s.id for s in lifted]}
        )  # fmt: skip
    else:
        render_lift(out(), target, lifted)
    if not lifted:
        raise CliError(f"no stop stands on {target}; nothing was lifted", FAILED)
    return OK


def cmd_erase(args: argparse.Namespace) -> int:
    """Erase a run's content (or every run of an owner) at once, keeping a tombstone; a run
    not finished is stopped and fenced out first. An unknown run or owner exits 2."""
    from runtime.ops.erasure import OwnerNotFound

    by = _who(args.by)
    c = _client()
    try:
        run_id = c.resolve_run_id(args.run) if args.run is not None else None
        done = c.erase(run_id=run_id, owner=args.owner, by=by)
    except (RunNotFound, OwnerNotFound) as exc:
        raise CliError(str(exc), USAGE) from None
    if args.json:
        print_json(done.to_json())
        return OK
    console = out()
    for erased_id, status in done.runs:
        stopped = " (stopped first)" if erased_id in done.stopped else ""
        console.print(Text(f"Erased run {erased_id}{stopped}: its tombstone says {status}."))
    console.print(Text(f"Audited as erased by {by}."))
    return OK


def cmd_call(args: argparse.Namespace) -> int:
    """One ad hoc tool call with a fresh key, audited; exit 1 unless it was made."""
    from liyagent.reporting import render_call
    from runtime.ops.adhoc import adhoc_call
    from store import db
    from tasks.services import services

    by = _who(args.by)
    call_args = json_object(args.args, "--args", "nothing was sent")
    s = services()
    tool = s.tools.get(args.tool)
    if tool is None:
        raise CliError(
            f"no tool named {args.tool!r}; known: {', '.join(s.tools.names())}; nothing was sent",
            USAGE,
        )
    db.ping(s.engine)  # the call is audited: Postgres must answer before anything is sent
    result = adhoc_call(s.tools, s.engine, s.settings.timings, args.tool, call_args, by)
    if args.json:
        print_json({"tool": args.tool, **result})
    else:
        render_call(out(), result)
    return _call_verdict(args.tool, result)


def _call_verdict(tool: str, result: dict[str, Any]) -> int:
    """OK for a call made; otherwise what happened and what to do (exit 1)."""
    key, status = result["key"], result["status"]
    error = result["outcome"].get("error")
    if status == "made":
        return OK
    if status == "refused":
        raise CliError(f"{tool} with key {key} was refused by its vendor: {error}", FAILED)
    if status == "failed":
        raise CliError(f"{tool} failed before sending anything ({error}); nothing was sent", FAILED)
    raise CliError(
        f"{tool} with key {key} may or may not have been made ({error}); check the vendor's "
        f"records for key {key} before calling again",
        FAILED,
    )


def _payload(raw: str | None) -> Any:
    """--payload as JSON (exit 2 naming it when it is not)."""
    try:
        return json.loads(raw) if raw is not None else None
    except ValueError as exc:
        raise CliError(f"--payload is not JSON ({exc}); nothing was sent", USAGE) from None


def cmd_signal(args: argparse.Namespace) -> int:
    """Send a run a signal: a workflow waiting for it goes on, an agent run sees it at its next
    step boundary; --key makes a send idempotent."""
    payload = _payload(args.payload)
    c = _client()
    run_id = c.resolve_run_id(args.run)
    try:
        signal_id = c.signal(run_id, args.name, payload, key=args.key, by=_who(args.by))
    except BadRequest as exc:
        raise CliError(str(exc), FAILED) from None
    if args.json:
        print_json({"run": run_id, "signal": args.name, "signal_id": signal_id})
    else:
        out().print(Text(f"signal {args.name} sent to run {run_id} (id {signal_id})"))
    return OK


def cmd_event(args: argparse.Namespace) -> int:
    """Publish an event to every workflow that waits for it (its name, and --match when given);
    --key makes a publish idempotent."""
    payload = _payload(args.payload)
    try:
        event_id = _client().publish_event(
            args.name, payload, match=args.match, key=args.key, by=_who(args.by)
        )
    except BadRequest as exc:
        raise CliError(str(exc), USAGE) from None
    if args.json:
        print_json({"event": args.name, "match": args.match, "event_id": event_id})
    else:
        out().print(Text(f"event {args.name} published (id {event_id})"))
    return OK


def _event(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="the event's name (what workflows wait for)")
    p.add_argument("--match", help="the value waits name beside it (an order id, a ticket)")
    p.add_argument("--payload", metavar="JSON", help="what it carries (any JSON value)")
    p.add_argument("--key", help="idempotency key: the same key publishes nothing more")
    p.add_argument("--by", required=True, metavar="WHO", help="who publishes (recorded)")
    add_json(p)
    p.set_defaults(handler=cmd_event)


def _signal(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN_ID", help="the run (an id or a unique prefix)")
    p.add_argument("name", metavar="NAME", help="the signal's name (what the run waits for)")
    p.add_argument("--payload", metavar="JSON", help="what it carries (any JSON value)")
    p.add_argument("--key", help="idempotency key: the same key sends nothing more")
    p.add_argument("--by", required=True, metavar="WHO", help="who sends (audited)")
    add_json(p)
    p.set_defaults(handler=cmd_signal)


def _approvals(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", metavar="RUN_ID")
    add_json(p)
    p.set_defaults(handler=cmd_approvals)


def _decision(
    handler: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.ArgumentParser], None]:
    """The options of `approve` and `deny`, which differ only in their handler."""

    def arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("approval_id", metavar="APPROVAL_ID")
        p.add_argument("--by", required=True, metavar="WHO", help="who decides")
        p.add_argument("--reason", help="why (the run's model is told)")
        add_json(p)
        p.set_defaults(handler=handler)

    return arguments


def _stop(p: argparse.ArgumentParser) -> None:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--run", metavar="RUN_ID", help="the run (an id or a unique prefix)")
    target.add_argument("--agent", metavar="NAME", help="the agent whose runs to stop")
    p.add_argument("--reason", help="why (told on the run's transcript; required to stop)")
    p.add_argument("--by", required=True, metavar="WHO", help="who stops or lifts (audited)")
    p.add_argument(
        "--lift", action="store_true", help="lift the stops standing on the run or agent"
    )
    add_json(p)
    p.set_defaults(handler=cmd_stop)


def _erase(p: argparse.ArgumentParser) -> None:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--run", metavar="RUN_ID", help="the run (an id or a unique prefix)")
    target.add_argument(
        "--owner",
        metavar="OWNER",
        help="the owner whose runs to erase, as the runs name it: the owner the client gave; "
        "for a Teams person their Microsoft Entra object id (the activity's from.aadObjectId, "
        "a lower-case GUID), never a display name",
    )
    p.add_argument("--by", required=True, metavar="WHO", help="who erases (audited)")
    add_json(p)
    p.set_defaults(handler=cmd_erase)


def _call(p: argparse.ArgumentParser) -> None:
    p.add_argument("tool", metavar="TOOL")
    p.add_argument("--args", default="{}", metavar="JSON", help="the call's arguments (object)")
    p.add_argument("--by", required=True, metavar="WHO", help="who calls (audited)")
    add_json(p)
    p.set_defaults(handler=cmd_call)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "approvals": _approvals,
    "approve": _decision(cmd_approve),
    "deny": _decision(cmd_deny),
    "stop": _stop,
    "erase": _erase,
    "call": _call,
    "signal": _signal,
    "event": _event,
}
