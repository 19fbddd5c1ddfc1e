"""Sending a signal to a run, or publishing an event to the workflows that wait for it (the
client, the front, the CLI): stored and the waiting runs woken in one statement
(store/signals.py, store/workflow_events.py), then the woken runs' messages published."""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic_core import PydanticSerializationError, to_jsonable_python

from runtime.core.enqueue import BadRequest, publish_quietly
from runtime.services import Services
from runtime.toolbox.workflow_kinds import check_name
from store.db import transaction
from store.scope import Scope
from store.signals import send_signal
from store.workflow_events import publish_event

# An event's match value (an order id, a ticket): what a wait names beside the event's name.
MAX_MATCH_CHARS = 200

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
    payload = _checked_payload(payload, f"run {run_id}: signal {name}")
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


def publish(
    s: Services,
    name: str,
    payload: Any,
    *,
    match: str | None,
    key: str | None,
    by: str,
    principal: str | None = None,
) -> int:
    """Publish the event `name` (with `match`) to every workflow that waits for it, now or
    later (`principal`'s only, when given: a front token's), once per `key` (a fresh key when
    None); the event's id. BadRequest when the name, match or payload cannot be published:
    nothing is stored then."""
    try:
        check_name(name, "event")
    except ValueError as exc:
        raise BadRequest(f"{exc}; nothing was published") from None
    if match is not None and not 0 < len(match) <= MAX_MATCH_CHARS:
        raise BadRequest(
            f"event {name}: match must be 1-{MAX_MATCH_CHARS} characters; nothing was published"
        )
    payload = _checked_payload(payload, f"event {name}")
    with transaction(s.engine) as conn:
        done = publish_event(
            conn,
            name=name,
            match=match,
            payload=payload,
            key=key or f"evt-{uuid.uuid4().hex}",
            by=by,
            principal=principal,
        )
    for run_id, attempt in done.woke:
        publish_quietly(s.changes, s.publisher, run_id, attempt)
    return done.event_id


def _checked_payload(payload: Any, what: str) -> Any:
    """The payload as JSON values (dates, UUIDs and models as pydantic writes them), small
    enough to be recorded with the step that takes it (BadRequest otherwise)."""
    try:
        payload = to_jsonable_python(payload)
        size = len(json.dumps(payload, allow_nan=False).encode())
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise BadRequest(f"{what}: its payload is not JSON ({exc}); nothing was sent") from None
    if size > MAX_PAYLOAD_BYTES:
        raise BadRequest(
            f"{what}: its payload is {size} bytes, more than {MAX_PAYLOAD_BYTES}; send a "
            "reference (an id) instead; nothing was sent"
        )
    return payload
