"""A stand-in for an attempt's lease, as the send guard asks it (runtime/sending/http.py
`SendGuard`): its local deadline, moved on by `until`, lost by `lost`, and where its reads wait."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from runtime.sending.in_flight import InFlight


@dataclass
class Lease:
    until: float
    lost: bool = False
    in_flight: InFlight = field(default_factory=InFlight)

    def send_time_left_s(self) -> float:
        return 0.0 if self.lost else self.until - time.monotonic()

    def regained(self) -> bool:
        return False  # no store blip here: a lease out of time stays out

    def why_not(self) -> str:
        return "run r: attempt 1 may not send: its lease may have lapsed"
