"""What an attempt was reserved for the model step it is asking, noted in Redis before the
request (issue 34, item 2): one `SET ... PX` a model step, no Postgres statement. The claim of
the attempt's loss reads the notes of the attempts it claims (one MGET a batch) and records each
as unconfirmed usage in the claim's own statement (store/ledger.py), for a step the lost
attempt never wrote.

A note is an upper bound of what the provider may bill for the request: its input tokens
bounded by the bytes of what is sent (runtime/core/ledger.py), its output by the request's
max_tokens. Redis lost (restarted empty, failed over, unreachable when noted or when read), or a
claim later than the note's life: no note, nothing recorded for that request: the window in
which a lost request's usage is not known (docs/stores.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from decimal import Decimal

import redis
import structlog

from store.ledger import Note

log = structlog.get_logger(__name__)

# How long a note lives: well past any claim (a loss is claimed seconds after its lease lapses;
# a fleet down for longer than this loses the note, and only that), bounded so the notes of
# finished runs go by themselves (runtime/fleet/keyspace.py).
NOTE_TTL_MS = 3_600_000


def note_key(namespace: str, run_id: str, attempt: int) -> str:
    """One attempt's note (runtime/fleet/keyspace.py): its own key, so a stale attempt's late
    note never overwrites a newer attempt's."""
    return f"{namespace}usage:note:{run_id}:{attempt}"


def to_json(note: Note) -> str:
    """A note as stored (dollars as a decimal string)."""
    raw = asdict(note)
    raw["cost_usd"] = None if note.cost_usd is None else f"{note.cost_usd:f}"
    return json.dumps(raw, separators=(",", ":"))


def from_json(raw: bytes) -> Note:
    """A note as `to_json` stored it."""
    data = json.loads(raw)
    cost = data.get("cost_usd")
    return Note(
        run_id=str(data["run_id"]),
        attempt=int(data["attempt"]),
        step=int(data["step"]),
        input_tokens=int(data["input_tokens"]),
        output_tokens=int(data["output_tokens"]),
        model=data.get("model"),
        cost_usd=None if cost is None else Decimal(cost),
    )


def note(client: redis.Redis[bytes], namespace: str, reserved: Note) -> None:
    """Note what `reserved`'s attempt reserved for its step (one round trip). Redis out of
    reach: no note (the window said above); the step goes on, never blocked by its ledger."""
    try:
        client.set(
            note_key(namespace, reserved.run_id, reserved.attempt),
            to_json(reserved),
            px=NOTE_TTL_MS,
        )
    except redis.RedisError as exc:
        log.debug("usage.note_failed", run_id=reserved.run_id, error=str(exc))


def read(client: redis.Redis[bytes], namespace: str, lost: Sequence[tuple[str, int]]) -> list[Note]:
    """The notes of the lost attempts `lost` (run id, attempt) that have one (one MGET); none
    when Redis is out of reach (the claim goes on: a loss is never held up by its ledger)."""
    if not lost:
        return []
    try:
        raws = client.mget([note_key(namespace, run_id, attempt) for run_id, attempt in lost])
    except redis.RedisError as exc:
        log.warning("usage.notes_unread", runs=len(lost), error=str(exc))
        return []
    found: list[Note] = []
    for raw in raws:
        if raw is None:
            continue
        try:
            found.append(from_json(raw))
        except (ValueError, KeyError, TypeError):
            continue  # not a note this version wrote: nothing to record
    return found
