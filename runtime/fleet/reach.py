"""Whether this process still reaches Postgres while others do (`PostgresReach`): a process cut
from Postgres alone gives its leases up for a survivor to claim as store faults
(runtime/fleet/heartbeat.py `Heartbeat.let_go_all`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import redis
import structlog

from runtime.fleet.leases import Leases, monotonic_ms

log = structlog.get_logger(__name__)


class PostgresReach:
    """Whether this process still reaches Postgres, by a probe of its own: one `SELECT 1` on
    a connection of its own every `interval_ms`, each success told to Redis. A process cut
    from Postgres alone (Redis reachable) would otherwise keep renewing leases whose runs are
    blocked on Postgres, and no survivor could take them; `cut_off` says when it should give
    them up instead (`Heartbeat.let_go_all`). When every process is cut (a failover), nobody
    else reaches Postgres, `cut_off` stays False and the leases are kept, as before."""

    def __init__(
        self,
        ping: Callable[[], None],
        leases: Leases,
        holder: str,
        interval_ms: int,
        bound_ms: int,
        attempt_ms: int,
    ) -> None:
        self.ping = ping
        self.leases = leases
        self.holder = holder
        self.interval_ms = interval_ms
        # Not reached for this long (from the start of its last answered probe): cut off.
        self.bound_ms = bound_ms
        # A probe unanswered this long counts as failed (its link gives up about then too).
        self.attempt_ms = attempt_ms
        # Another holder's success counts only while this fresh (it probes every interval).
        self.fresh_ms = interval_ms + attempt_ms // 4
        now = monotonic_ms()
        self.last_ok_ms = now  # when the last probe that was answered started
        self.last_failed_ms = 0  # when the last probe that failed started
        self.in_flight_since: int | None = None
        self.on_cut_off: Callable[[], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="liyagent-postgres-probe", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def probe(self) -> None:
        """One probe: on an answer, tell Redis (others read it in `cut_off`); on a failure,
        judge whether this process is cut off and, if so, say so (`on_cut_off`)."""
        started = monotonic_ms()
        self.in_flight_since = started
        try:
            self.ping()
        except Exception:
            self.last_failed_ms = started
        else:
            self.last_ok_ms = started
            with contextlib.suppress(redis.RedisError):
                self.leases.reached_postgres(self.holder, 60_000)
        finally:
            self.in_flight_since = None
        if self.on_cut_off is not None and self.cut_off():
            self.on_cut_off()

    def reached_lately(self) -> bool:
        """Whether a probe was answered within about one round (interval plus a probe's
        wait); True before the probe has run, so a process that does not probe is not held."""
        if self._thread is None:
            return True
        return monotonic_ms() - self.last_ok_ms <= self.interval_ms + self.attempt_ms

    def cut_off(self) -> bool:
        """Whether this process has not reached Postgres for longer than the bound while
        another holder has, after a probe of this one that failed had started: Postgres is
        up, only this process is cut from it, so its runs are better claimed by the others
        (as store faults). Right after a failover, the first holder back cannot make the
        others cut off: their probes started after its success are answered."""
        now = monotonic_ms()
        if now - self.last_ok_ms <= self.bound_ms:
            return False
        failed_at = self.last_failed_ms
        if self.in_flight_since is not None and now - self.in_flight_since > self.attempt_ms:
            failed_at = max(failed_at, self.in_flight_since)
        try:
            ago = self.leases.others_reached_ms_ago(self.holder)
        except redis.RedisError:
            return False  # Redis away too: the presence and the leases' own deadlines judge
        return ago is not None and ago <= self.fresh_ms and failed_at > now - ago

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.probe()
            except Exception:  # the probe must outlive any one bad round
                log.exception("postgres_probe.error")
            self._stop.wait(self.interval_ms / 1000)
