"""How a call the last checkpoint left is taken up again on resume: the spec's table, as data.

Pure: it decides from the call's mark (if any), its tool as it stands now, and the bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.toolbox.tools import ToolKind
from store.states import MarkStatus, Settle

# Kinds sent with a key their vendor may dedupe on: a keyed write's step key, an approved
# call's approval id.
_KEYED = frozenset({ToolKind.KEYED_WRITE, ToolKind.APPROVAL_WRITE})


def taken_up_as(outcome: dict[str, object]) -> Settle:
    """How a call routed as on a first pass (MAKE) was taken up, by what routing it gave: a
    denied approval was not made and a call that failed before sending sent nothing, so
    neither is ever reported as made."""
    if outcome.get("denied") is True:
        return Settle.DENIED
    return Settle.FAILED if outcome.get("failed") is True else Settle.MAKE


@dataclass(frozen=True)
class MarkFacts:
    """What the call's mark says: its kind at marking time (a write stays a write, I7)."""

    kind: ToolKind
    status: MarkStatus
    stable_key: bool
    age_s: float


def decide(
    *,
    kind_now: ToolKind | None,
    mark: MarkFacts | None,
    has_reader: bool,
    dedupe_window_s: float | None,
    resume_bound_s: float,
) -> Settle:
    """The settlement of one call left by the checkpoint (I2, I7)."""
    if mark is None:
        # Never marked: a write was not sent (the mark precedes the send); a read is harmless.
        return Settle.MAKE
    if mark.status != MarkStatus.IN_DOUBT:
        return Settle.REUSE
    if mark.kind is ToolKind.READ:  # pragma: no cover - reads are never marked
        return Settle.MAKE
    if (
        mark.kind in _KEYED
        and mark.stable_key
        and dedupe_window_s is not None
        and dedupe_window_s > resume_bound_s
        and mark.age_s < dedupe_window_s
    ):
        return Settle.RESEND
    if has_reader:
        return Settle.READ_BACK
    return Settle.UNKNOWN


NOT_FOUND_NOTE = (
    "This call was not found by read-back: the process making it stopped while it was in "
    "flight, and the target has no record of it under its key yet. It was not sent again (the "
    "target may still be processing it). Check the target before asking for it again; a new "
    "call gets a new key."
)

UNKNOWN_NOTE = (
    "The outcome of this call is unknown: the process making it stopped while it was in "
    "flight. It was not sent again. Check the target system before repeating it."
)


def unknown_note(error: str) -> str:
    """The model's note for a call that failed in this attempt after its request may have
    reached its target (no process stopped: the call itself failed)."""
    return (
        f"The outcome of this call is unknown: it failed ({error}) after its request may have "
        "reached the target. It was not sent again. Check the target system before repeating "
        "it."
    )


def not_found_note(error: str) -> str:
    """The model's note for such a call that its reader then did not find."""
    return (
        f"This call was not found by read-back: it failed ({error}) after its request may have "
        "reached the target, and the target has no record of it under its key yet. It was not "
        "sent again (the target may still be processing it). Check the target before asking "
        "for it again; a new call gets a new key."
    )
