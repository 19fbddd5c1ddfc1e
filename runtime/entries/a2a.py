"""A2A tasks (the protocol's JSON-RPC endpoint is front/a2a.py, its request handler
front/a2a_tasks.py).

Starts: a SendMessage makes one run of the skill's catalog agent per message id (`a2a:<message id>`)
and front principal, linked to its task (named after the message, with its context and the message
itself; task ids are unique per principal) in the inserting statement. Its answer is handed on in
Postgres: the task is completed with the answer in the answering statement
(`store.a2a.a2a_end`, in `store.entries.ends_cte`). A failure is told the same way: the task is
failed in the failing statement; a CancelTask is an operator Stop of the run whose failure then
reads as canceled.
"""

from __future__ import annotations

from runtime.core.entry import EntryKindName, InPostgres, Policy
from runtime.entries.client import Client
from runtime.entries.start import start_entry
from runtime.services import Services
from store.a2a import a2a_link, mark_a2a_canceled
from store.rows import RunId

# A managed run that may wait (for a person's approval, its task `auth-required`), of the
# catalog's agent.
KIND = EntryKindName("a2a")
ENTRY = InPostgres(KIND, policy=Policy(may_wait=True, from_catalog=True))


def submit(
    s: Services,
    agent: str,
    text: str,
    message_id: str,
    context_id: str,
    message: str,
    *,
    principal: str,
) -> tuple[RunId, bool]:
    """The run of `principal`'s message `message_id` (made once), linked to its task in the
    same statement; `message` is the A2A message as received (JSON text). (run id, new)"""
    return start_entry(
        s,
        entry_kind=KIND,
        agent=agent,
        user_input=text,
        request_key=f"a2a:{message_id}",
        owner="a2a",
        channel="a2a",
        principal=principal,
        link=a2a_link(message_id, context_id=context_id, message=message),
    )


def cancel(s: Services, task_id: str, run_id: str, by: str) -> None:
    """CancelTask: an operator Stop of the task's run (BadRequest if it has ended), recorded on
    the task so its failure reads as canceled."""
    Client(s).stop(run_id=run_id, reason=f"A2A CancelTask of task {task_id}", by=by)
    with s.engine.connect() as conn:
        mark_a2a_canceled(conn, run_id)
