"""What a run's timeline picture marks with what (no drawing library needed): each settlement's
colour and meaning, the bars', losses', kills' and answers' colours, and a kill the harness
made itself. Shared by the picture (timeline.py) and its page (timeline_page.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# How each call ended, in the resume audit's words, and its colour (Okabe-Ito, colour-blind
# safe). `made`: sent (or, for a read, made) as on a first pass.
SETTLEMENT_COLOURS = {
    "made": "#0072B2",
    "reused": "#56B4E9",
    "resent": "#E69F00",
    "read_back": "#009E73",
    "not_found": "#CC79A7",
    "unknown": "#D55E00",
    "refused": "#555555",
    "failed": "#F0E442",
    "in_doubt": "#FFFFFF",
}
SETTLEMENT_MEANING = {
    "made": "made (sent once, or a read made again)",
    "reused": "outcome reused, not sent again",
    "resent": "keyed write sent again with its key",
    "read_back": "found at the vendor by its key",
    "not_found": "not found by read-back, not sent again",
    "unknown": "outcome unknown, not sent again",
    "refused": "refused by a gate",
    "failed": "failed before anything was sent",
    "in_doubt": "marked, never settled",
}
OTHER_COLOUR = "#999999"
BAR = "#C6DBEF"
BAR_EDGE = "#3B6EA8"
LOSS = "#C0392B"
KILL = "#7B0000"
ANSWER = "#D4A017"
QUEUE = "#BBBBBB"
QUEUE_LANE = "queue (no worker)"


@dataclass(frozen=True)
class KillMark:
    """A kill the harness made itself (it knows when it killed which worker): drawn as a mark,
    kept apart from the records, which only see the loss later."""

    at: datetime
    label: str = "SIGKILL"


def colour(outcome: str) -> str:
    """The colour of a settlement (grey for one this picture does not know)."""
    return SETTLEMENT_COLOURS.get(outcome, OTHER_COLOUR)
