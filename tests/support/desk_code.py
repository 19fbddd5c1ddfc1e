"""Two versions of a team's tool module, as a deploy replaces one with the other: the first
declares a read, a write and a nightly job; the next drops the write and the job and changes the
read's body (not its schema). Written by the deploy tests (cli `deploy check`/`status`, pins)."""

DESK_V1 = '''
from typing import Any

from liyagent import CallContext, JobContext, JobParams, job, tool


@tool.read(name="desk.lookup")
def lookup(ctx: CallContext, order: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order": order}


@tool.write(name="desk.refund")
def refund(ctx: CallContext, order: str) -> dict[str, Any]:
    """Refund an order."""
    return {"refunded": order}


class Nightly(JobParams):
    day: str


@job(kind="desk_nightly")
def nightly(ctx: JobContext, params: Nightly) -> dict[str, object]:
    """The nightly reconciliation."""
    return {"day": params.day}
'''
# The next version: the refund tool and the nightly job are gone.
DESK_V2 = '''
from typing import Any

from liyagent import CallContext, tool


@tool.read(name="desk.lookup")
def lookup(ctx: CallContext, order: str) -> dict[str, Any]:
    """Look an order up (the new code's)."""
    return {"order": order, "v": 2}
'''
