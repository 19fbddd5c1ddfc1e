"""How much the front lets one client hold: the time to send a request's head and its body, and
how many connections may be open at once, sized against the process's file descriptor limit
(raised to its hard limit at start) so sockets can never take the descriptors Postgres, Redis
and the log need.

Settings (`LIYAGENT_FRONT_*`): `HEAD_TIMEOUT_S` (5) the time a connection has to send a whole
request head, from when it opened or its previous answer ended; `BODY_TIMEOUT_S` (30) the time
from a head to the end of its body; `MAX_CONNECTIONS` (1024) open connections at most, lowered
to fit the descriptor limit; `BACKLOG` (2048) connections the kernel may queue before they
are accepted (they hold no descriptor there; the kernel caps it at net.core.somaxconn);
`REFUSAL_LOG_S` (10) how often refused connections are summarised in one log line.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, replace

from runtime.base.settings import ConfigError

# Descriptors kept for everything but client sockets: the Postgres and Redis pools, event
# stream watches, the log, the listening socket, libraries' own files.
RESERVED_FDS = 64
# Sockets one accept round takes at most (asyncio accepts that many per loop turn). A socket
# shed at the cap frees its descriptor a few turns after the round that took its successor, so
# about four rounds are kept free under the cap.
ACCEPT_BATCH = 64
ROUNDS_IN_FLIGHT = 4


def _positive(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ConfigError(f"{name}={raw!r} must be more than 0 (default {default:g})")
    return value


def _count(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name}={raw!r} must be a whole number of 1 or more (default {default})")
    return int(raw)


@dataclass(frozen=True)
class FrontLimits:
    """The front's bounds on clients (see the module's docstring for each setting)."""

    head_timeout_s: float = 5.0
    body_timeout_s: float = 30.0
    max_connections: int = 1024
    backlog: int = 2048
    refusal_log_s: float = 10.0
    accept_batch: int = ACCEPT_BATCH

    @classmethod
    def from_env(cls) -> FrontLimits:
        return cls(
            head_timeout_s=_positive("LIYAGENT_FRONT_HEAD_TIMEOUT_S", cls.head_timeout_s),
            body_timeout_s=_positive("LIYAGENT_FRONT_BODY_TIMEOUT_S", cls.body_timeout_s),
            max_connections=_count("LIYAGENT_FRONT_MAX_CONNECTIONS", cls.max_connections),
            backlog=_count("LIYAGENT_FRONT_BACKLOG", cls.backlog),
            refusal_log_s=_positive("LIYAGENT_FRONT_REFUSAL_LOG_S", cls.refusal_log_s),
        )

    def fitted(self, fd_limit: int) -> FrontLimits:
        """These limits with the accept round and the connection cap lowered to fit `fd_limit`
        descriptors: the open connections, the rounds in flight and the reserve stay under it,
        so accepting does not fail for want of a descriptor. ConfigError when even a handful
        of connections cannot fit."""
        budget = fd_limit - RESERVED_FDS
        batch = min(self.accept_batch, budget // (2 * ROUNDS_IN_FLIGHT))
        connections = min(self.max_connections, budget - ROUNDS_IN_FLIGHT * batch)
        if batch < 1 or connections < 8:
            raise ConfigError(
                f"the front may open only {fd_limit} files (ulimit -n); it needs at least "
                f"{RESERVED_FDS + 16}: raise the limit (LimitNOFILE=, ulimits.nofile)"
            )
        return replace(self, max_connections=connections, accept_batch=batch)


def raise_fd_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit (a default soft limit of
    1024 is far below what a server needs); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY:
        return target
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return soft
