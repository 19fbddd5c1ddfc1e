"""The one base of every error liyagent raises for its caller to catch (`liyagent.LiyagentError`):
a bad request, a run or owner not found, a setting to fix, a seal that does not verify, a
model, tool or job that failed. Each says what happened, names the run where there is one
(`run_id`) and what to do next. It lives in the lowest layer so the store's own errors (a run
not found, a request key already used) share it; the engine's control flow (a wait, a
hand-back, a fenced-out write) is not one of them."""

from __future__ import annotations


class LiyagentError(Exception):
    """An error of liyagent's for its caller: the message says what to do next."""

    # The run it concerns, when there is one.
    run_id: str | None = None
