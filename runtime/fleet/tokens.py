"""What names a lease and what the lease modules share: the token (`<run id>:<attempt>:<holder>`),
a lease taken with its run's step witness, and the constants and small helpers every part of
the leases uses."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

# The fence token's holder part: no process is named so (holders are host-pid).
FENCE_HOLDER = "~sweep"
# A step witness lives this long past its last renewal (a run waiting longer loses it: a
# rollback of its newest step is then not seen); it is deleted when the run ends.
WITNESS_TTL_S = 30 * 86400
# No step written (none witnessed).
NO_STEP = -1
# Every engine process names its Redis connections `lya:<holder>` (runtime/fleet/presence.py).
CONNECTION_PREFIX = "lya:"


@dataclass(frozen=True)
class Token:
    """Names one attempt of one run: `<run id>:<attempt>:<holder>`."""

    run_id: str
    attempt: int
    holder: str

    def __str__(self) -> str:
        return f"{self.run_id}:{self.attempt}:{self.holder}"

    @classmethod
    def parse(cls, raw: str) -> Token:
        run_id, attempt, holder = raw.split(":", 2)
        return cls(run_id, int(attempt), holder)


@dataclass(frozen=True)
class Acquired:
    """A lease taken, with the highest step the run's attempts wrote, as Redis witnessed it
    (`NO_STEP` when Redis holds none: never written, or lost with Redis's data)."""

    witnessed_step: int


def store_epoch_key(namespace: str) -> str:
    """Where a namespace's store epoch is kept (runtime/fleet/store_epoch.py)."""
    return f"{namespace}store:epoch"


def consumers_key(namespace: str) -> str:
    """The set of worker main processes consuming the runs' queue (runtime/fleet/holder_work.py
    `watch`): the death watch takes each when it goes, whatever it holds."""
    return f"{namespace}holders:consumers"


def queues_key(namespace: str) -> str:
    """The set of queues the consumers take messages from (their `-Q`): every list the death
    watch reads for messages a dead consumer took and recorded nowhere
    (runtime/recovery/untraced.py)."""
    return f"{namespace}holders:queues"


def add_consumer(
    client: redis.Redis[bytes], namespace: str, holder: str, queues: tuple[str, ...]
) -> None:
    """Make a worker's main process a consumer of these queues (one round trip): its death is
    taken whatever it holds, and its queues are read when it dies."""
    pipe = client.pipeline(transaction=False)
    pipe.sadd(consumers_key(namespace), holder)
    pipe.sadd(queues_key(namespace), *queues)
    pipe.execute()


def fence_token(token: Token) -> Token:
    """The token a sweeper holds a missing lease key with while it claims the run."""
    return Token(token.run_id, token.attempt, FENCE_HOLDER)


def text_of(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)
