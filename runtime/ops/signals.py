"""Sending a signal to a run (the client, the front, the CLI): stored and its waiting run woken
in one statement (store/signals.py), then the woken run's message published."""

from __future__ import annotations

import uuid
from typing import Any

from runtime.core.enqueue import BadRequest, publish_quietly
from runtime.services import Services
from runtime.toolbox.workflow_kinds import check_name
from store.db import to_json
from store.scope import Scope
from store.signals import send_signal

# A signal's payload is recorded with the step that takes it: bounded like a small step.
MAX_PAYLOAD_BYTES = 64 * 1024


def send(
    s: Services,
    run_id: str,
    name: str,
    payload: Any,
    *,
    key: str | None,
    by: str,
    scope: Scope | None = None,
) -> int:
    """Send `name` with `payload` to the run, once per `key` (a fresh key when None); the
    signal's id. BadRequest naming the run when it does not exist (or `scope` does not see
    it) or has ended, or when the name or payload cannot be sent: nothing is stored then."""
    try:
        check_name(name, "signal")
    except ValueError as exc:
        raise BadRequest(f"run {run_id}: {exc}; nothing was sent") from None
    try:
        size = len(to_json(payload).encode())
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"run {run_id}: signal {name}: its payload is not JSON ({exc})") from None
    if size > MAX_PAYLOAD_BYTES:
        raise BadRequest(
            f"run {run_id}: signal {name}: its payload is {size} bytes, more than "
            f"{MAX_PAYLOAD_BYTES}; send a reference (an id) instead; nothing was sent"
        )
    with s.engine.begin() as conn:
        sent = send_signal(
            conn,
            run_id=run_id,
            name=name,
            payload=payload,
            key=key or f"sig-{uuid.uuid4().hex}",
            by=by,
            scope=scope,
        )
    if sent.run_status is None:
        raise BadRequest(f"run {run_id} does not exist; nothing was sent")
    if sent.signal_id is None:
        raise BadRequest(
            f"run {run_id} has ended ({sent.run_status}); signal {name} was not sent: start "
            "a new run"
        )
    if sent.woke is not None:
        publish_quietly(s.changes, s.publisher, run_id, sent.woke)
    return sent.signal_id
