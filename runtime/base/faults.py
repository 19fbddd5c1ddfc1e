"""Named fault points, armed only in tests, so a worker can be killed at an exact place.

`LIYAGENT_FAULT=<point>:<action>[:<nth>]`, e.g. `after_mark:kill` or `after_send:stop:2`:
`kill` SIGKILLs the whole worker (its process group, as a dead machine would), `stop` SIGSTOPs
the process that reached it (the thread that reached it stops at the point itself) so a test
can decide what happens next. A fault fires once per armed worker, across its pool processes:
firing creates `LIYAGENT_FAULT_FILE` exclusively (naming the point and pid), and a fault whose
file exists never fires again. Unarmed, a point costs one environment lookup.
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = frozenset(
    {
        "before_reserve",  # a worker's main process took a run's message, before reserving it
        "before_lease",  # a worker took a run's message, before it took the run's lease
        "after_lease",  # a worker took the run's lease, before it claimed the run in Postgres
        "after_claim",  # the run is ours, before the model is asked anything
        "after_model_step",  # the model answered a step, before its checkpoint is written
        "after_checkpoint",  # the checkpoint is written, before any call is made
        "after_mark",  # a write is marked in doubt, before it is sent
        "before_send",  # a write's lease was just checked; its request has not left yet
        "after_send",  # the vendor received the write, before its outcome is recorded
        "after_outcome",  # the outcome is recorded, before the next checkpoint
        "after_answer",  # the final answer is stored, before it is handed on
        "after_reply",  # the Teams reply is posted, before the run is recorded delivered
        "after_request",  # an approval or a child run is filed, before the run waits for it
        # A model step met a 429 or starts to wait for its endpoint, before its run event.
        "before_endpoint_event",
        "after_page",  # a source sync upserted a page, before its cursor is checkpointed
        "in_job_batch",  # a job that is not written ahead is between two batches of its work
    }
)

_lock = threading.Lock()
_hits: dict[str, int] = {}


def _armed() -> tuple[str, str, int] | None:
    raw = os.environ.get("LIYAGENT_FAULT", "")
    if not raw:
        return None
    name, _, rest = raw.partition(":")
    action, _, nth = rest.partition(":")
    if name not in POINTS or action not in {"kill", "stop"}:
        raise ValueError(
            f"LIYAGENT_FAULT={raw!r}: use <point>:<kill|stop>[:<nth>], points {sorted(POINTS)}"
        )
    return name, action, int(nth or 1)


def point(name: str) -> None:
    """Do nothing unless the fault named `name` is armed and this is its nth hit."""
    armed = _armed()
    if armed is None or armed[0] != name:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] != armed[2]:
            return
    marker = os.environ.get("LIYAGENT_FAULT_FILE")
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return  # another process of this worker already fired it
        os.write(fd, f"{name} {os.getpid()}\n".encode())
        os.close(fd)
    if armed[1] == "kill":
        os.killpg(os.getpgid(0), signal.SIGKILL)
    # SIGSTOP at the calling thread itself, not at the process: a stop signal stops the whole
    # process either way, but one sent with kill(getpid()) is taken by the main thread, and a
    # pool thread that hit the point runs on for milliseconds until the main thread starts the
    # stop (measured: up to 3.6 ms), long enough to pass the send guard while the lease is
    # still valid and write a request's headers before it stops. Directed at this thread, the
    # stop begins as the call returns, here, where the point says.
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def publish_times() -> int:
    """How many times each task message is published: 1, or more when a test arms
    `LIYAGENT_FAULT_PUBLISH_TIMES` to prove duplicate deliveries change nothing (I4)."""
    raw = os.environ.get("LIYAGENT_FAULT_PUBLISH_TIMES", "")
    return max(1, int(raw)) if raw.strip() else 1
