"""Runs written straight to Postgres, as the client stores one (an empty sealed checkpoint) but
never published: what the store's own tests work on."""

from __future__ import annotations

import uuid
from typing import Any

from store.runs import claim_delivery, insert_run


def stored_run(
    stack: Any,
    agent: str = "ledger",
    *,
    run_id: str | None = None,
    claimed: bool = False,
    **row: Any,
) -> str:
    """A queued run of `agent` (`row`: more of `insert_run`'s fields, e.g. tenant); `claimed`:
    taken by its first attempt too."""
    run_id = run_id or str(uuid.uuid4())
    sealed = stack.sealer.seal(run_id, "checkpoint", 0, {"messages": []})
    with stack.db() as conn:
        insert_run(conn, run_id=run_id, correlation_id=run_id, request_key=None, agent=agent,
                   owner="app", entry_kind="plain", definition=b"", user_input="x",
                   sealed_checkpoint=sealed, **row)  # fmt: skip
        if claimed:
            assert claim_delivery(conn, run_id, 1, "test") is not None
    return run_id
