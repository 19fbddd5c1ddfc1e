"""Ad hoc calls: a person calls a tool outside any run (the CLI's `call`). Such a call is in no
step's scope, so it gets a fresh key every time (I8), and it is audited."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from runtime.base.settings import Timings
from runtime.durable.keys import fresh_key
from runtime.sending import traffic
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tools import (
    CallContext,
    InvalidArguments,
    ToolError,
    ToolFailed,
    ToolInDoubt,
    ToolKind,
    ToolRegistry,
)
from store.errors import LiyagentError
from store.records import insert_audit


class UnknownTool(LiyagentError, LookupError):
    """No tool has this name."""


def adhoc_call(
    tools: ToolRegistry,
    engine: sa.Engine,
    timings: Timings,
    tool_name: str,
    args: dict[str, Any],
    by: str,
) -> dict[str, Any]:
    """Make one call now with a fresh key; its outcome (or error) is returned and audited
    (in `engine`'s audit table)."""
    tool = tools.get(tool_name)
    if tool is None:
        raise UnknownTool(f"no tool named {tool_name!r}; known: {', '.join(tools.names())}")
    if tool.kind in (ToolKind.DELEGATION, ToolKind.APPROVAL_WRITE):
        raise ToolError(f"{tool_name} is a {tool.kind.value}; it can only be made by a run")
    key = fresh_key()
    timeout = timings.call_timeout_s
    ctx = CallContext(
        run_id="adhoc",
        attempt=0,
        step=0,
        call_id=key,
        tool=tool_name,
        key=key,
        stable_key=False,
        timeout_s=timeout,
        http=CallHTTP.for_call(
            key=key, run_id="adhoc", attempt=0, call=f"adhoc:{by}", timeout_s=timeout
        ),
    )
    try:
        tool.validate(args)
        with traffic.watched():  # what the send guard sees tells a failure from a doubt
            outcome: dict[str, Any] = tool.make(args, ctx)
        status = "made"
    except InvalidArguments as exc:
        outcome, status = exc.outcome(), "refused"
    except ToolFailed as exc:  # raised before any request left: nothing was sent
        outcome, status = exc.outcome(), "failed"
    except ToolError as exc:
        outcome, status = {"error": str(exc)}, "refused"
    except ToolInDoubt as exc:
        outcome, status = {"outcome": "unknown", "error": str(exc)}, "in_doubt"
    with engine.connect() as conn:
        insert_audit(
            conn,
            kind="tool.adhoc_call",
            detail={
                "tool": tool_name,
                "kind": tool.kind.value,
                "key": key,
                "by": by,
                "status": status,
            },
        )
    return {"key": key, "status": status, "outcome": outcome}
