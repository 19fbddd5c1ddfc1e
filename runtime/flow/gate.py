"""A model endpoint's gate, shared by the whole fleet through Redis (issue 33, item 3).

A request answered 429 closes its endpoint (its model profile) for every worker until its
Retry-After (or an exponential backoff when it names none, capped), never shortening a longer
close already set: one atomic script (`lua/close.lua`) stores the close in the deployment's
`flow:closed` hash, by Redis's own clock, and publishes it on `flow:closes`. Every process that
makes model calls hears it through its one subscriber (`closes.py`), so the check before each
model request reads a local map and costs no Redis round trip; the process that met the 429
closes its own map at once, before the script. The scripts are read once per process.

Redis out of reach: the gate admits (fail open, said once per outage), and a 429 met then is
waited out by its own process alone. The closes lost with Redis cost a moment of over-admission
(the provider answers 429 again and closes it again), never a run.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import redis
import structlog

from runtime.base.logs import SaidOnce
from runtime.base.tenancy import OTHER
from runtime.flow.closes import Closes
from runtime.flow.limits import Limiter, stats_key

log = structlog.get_logger(__name__)

# The scripts, one file each under lua/ (every key and argument in its header).
NAMES = ("close", "closes")
# A 429 without a Retry-After: closed 1 s, then 2, 4, ... at most a minute; the count is
# forgotten once the endpoint has been open that long. A Retry-After above the longest close
# is cut to it (a provider's header is never trusted to close an endpoint for hours).
BACKOFF_MS = 1_000
BACKOFF_MAX_MS = 60_000
CLOSE_MAX_MS = 900_000


@cache
def source(name: str) -> str:
    """The Lua source of script `name`."""
    return (files("runtime.flow") / "lua" / f"{name}.lua").read_text()


def closed_key(namespace: str) -> str:
    """The deployment's closes: field per model profile -> until (runtime/fleet/keyspace.py)."""
    return f"{namespace}flow:closed"


def backoffs_key(namespace: str) -> str:
    """The deployment's backoff counts: field per model profile (runtime/fleet/keyspace.py)."""
    return f"{namespace}flow:backoffs"


def closes_channel(namespace: str) -> str:
    """The channel every close is published on (`<profile> <ms left>`)."""
    return f"{namespace}flow:closes"


class EndpointGates:
    """The gates of this deployment's model endpoints: closes set in Redis, heard by this
    process's subscriber (on `listener`, a client of its own; the engine's by default)."""

    def __init__(
        self,
        client: redis.Redis[bytes],
        namespace: str,
        listener: redis.Redis[bytes] | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.scripts = {name: client.register_script(source(name)) for name in NAMES}
        # The fleet's limits on endpoints whose profiles declare them (`limits.py`).
        self.limiter = Limiter(client, namespace)
        # Thresholds are plain attributes, so a test can shorten them.
        self.backoff_ms = BACKOFF_MS
        self.backoff_max_ms = BACKOFF_MAX_MS
        self.close_max_ms = CLOSE_MAX_MS
        self._outage = SaidOnce(log, "flow.gate_unreachable", "flow.gate_reached")
        self.listener = listener or client
        self.closes = Closes(
            self.listener,
            closes_channel(namespace),
            self._closes_in_force,
            lost=self._lost,
            reached=self._reached,
        )

    def closed_for_ms(self, profile: str) -> int:
        """0 when `profile`'s endpoint is open (or Redis is out of reach: fail open), else how
        many ms it stays closed. No network: this process's map, which its subscriber keeps
        (started here at the process's first call, which waits for its first read)."""
        self.closes.start()
        return self.closes.left_ms(profile)

    def close(self, profile: str, retry_after_s: float | None, tenant: str = OTHER) -> int:
        """A request to `profile` of a run of `tenant` (its label) was answered 429: close its
        endpoint here at once, then for the fleet; how many ms it is closed for now. With Redis
        out of reach, the wait this 429 asks for alone (this process waits it out by itself)."""
        asked = -1 if retry_after_s is None else round(retry_after_s * 1000)
        here = min(self.close_max_ms, self.backoff_ms if asked < 0 else asked)
        self.closes.note(profile, here)
        keys = [closed_key(self.namespace), backoffs_key(self.namespace), stats_key(self.namespace)]
        args = [profile, asked, self.backoff_ms, self.backoff_max_ms, self.close_max_ms]
        args += [closes_channel(self.namespace), tenant]
        try:
            left = int(self.scripts["close"](keys=keys, args=args))
        except redis.RedisError as exc:
            self._lost(exc)
            return here
        self._reached()
        self.closes.note(profile, left)
        return max(0, left)

    def count(self, profile: str, counter: str, tenant: str = OTHER) -> None:
        """Count one `counter` (`waits_in_place`, `waits_suspended`) for `profile` and `tenant`
        (its label) in the fleet's counters: a wait on a close, which no script call carries
        (one round trip, made only when a step is about to wait anyway); none without Redis."""
        try:
            field = f"{counter}:{profile}:{tenant}"
            self.client.hincrby(stats_key(self.namespace), field, 1)
        except redis.RedisError as exc:
            self._lost(exc)

    def stop(self) -> None:
        """Stop this process's subscriber (tests)."""
        self.closes.stop()

    def _closes_in_force(self) -> dict[str, int]:
        """The closes in force now, profile -> ms left by Redis's clock (one script call, on
        the subscriber's client: the engine's pool, sized by its threads, is not drawn on)."""
        raw = self.scripts["closes"](keys=[closed_key(self.namespace)], client=self.listener)
        pairs = iter(raw)
        return {_text(profile): int(left) for profile, left in zip(pairs, pairs, strict=True)}

    def _lost(self, exc: Exception) -> None:
        """Said once per outage: the gates admit until Redis answers again."""
        self._outage.lost(error=str(exc), admits=True)

    def _reached(self) -> None:
        self._outage.reached()


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw
