"""Redis's record of a holder's presence, read from both sides: how long a holder with no
connection has been absent by its epoch's age (what a starting death watch reads), and since
when the holder counts itself absent (its sends stop within the grace of that moment)."""

from __future__ import annotations

import time

from runtime.fleet.heartbeat import SAFETY_MARGIN_MS, RunLease
from runtime.fleet.leases import Token
from runtime.fleet.presence import (
    EPOCH_TTL_MS,
    STALE_MS,
    Presence,
    absent_for_ms,
    new_epoch,
)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def test_an_epoch_refreshed_within_the_bound_says_nothing_of_an_absence() -> None:
    assert absent_for_ms(new_epoch(), EPOCH_TTL_MS) == 0
    assert absent_for_ms(new_epoch(), EPOCH_TTL_MS - STALE_MS) == 0


def test_an_epoch_older_than_the_bound_says_how_long_its_holder_has_been_absent() -> None:
    assert absent_for_ms(new_epoch(), EPOCH_TTL_MS - STALE_MS - 700) == 700


def test_the_bound_is_the_one_the_holder_named() -> None:
    # A holder keeping a 6 s bound, 7 s after its last refresh: absent for 1 s at least.
    assert absent_for_ms("s6000:abc", EPOCH_TTL_MS - 7000) == 1000


def test_an_epoch_naming_no_bound_says_nothing() -> None:
    # A process of an older release: its refresh bound is unknown, it is given the grace.
    assert absent_for_ms("0123456789abcdef", EPOCH_TTL_MS - 9000) == 0
    assert absent_for_ms("sx:abc", EPOCH_TTL_MS - 9000) == 0


def test_a_lapsed_epoch_is_absence_for_its_whole_ttl_and_one_without_ttl_for_none() -> None:
    assert absent_for_ms("", -2) == EPOCH_TTL_MS - STALE_MS
    assert absent_for_ms(new_epoch(), -1) == 0


def _presence() -> Presence:
    return Presence("redis://127.0.0.1:1/0", "ns:", "host-1", grace_ms=1000)  # never started


def test_a_presence_refreshed_lately_is_present() -> None:
    p = _presence()
    p.up, p.refreshed_ms = True, _now_ms()
    assert p.absent_since_ms() is None and p.cap_ms() is None


def test_a_presence_not_refreshed_for_the_bound_counts_itself_absent_from_then() -> None:
    # A starved or stopped process: Redis's record makes it absent from this moment, so its
    # own sends must stop within the grace of it, as after a loss it saw.
    p = _presence()
    p.up, p.refreshed_ms = True, _now_ms() - STALE_MS - 50
    assert p.absent_since_ms() == p.refreshed_ms + STALE_MS
    assert p.cap_ms() == p.refreshed_ms + STALE_MS + 1000


def test_a_presence_that_is_down_counts_from_its_loss() -> None:
    p = _presence()
    p.up, p.lost_at_ms = False, _now_ms() - 10
    assert p.absent_since_ms() == p.lost_at_ms and p.cap_ms() == p.lost_at_ms + 1000


def test_a_lease_sends_within_the_grace_of_a_stale_presence_and_in_full_once_refreshed() -> None:
    p = _presence()
    p.up, p.refreshed_ms = True, _now_ms() - STALE_MS - 50
    lease = RunLease(
        Token("run-1", 1, "host-1"),
        leases=None,  # type: ignore[arg-type]  # the local deadline needs no Redis
        valid_until_ms=_now_ms() + 8000,
        presence=p,
        confirmed_ms=_now_ms(),
    )
    assert lease.blipped()
    assert lease.send_time_left_s() <= (1000 - SAFETY_MARGIN_MS - 50) / 1000
    p.refreshed_ms = _now_ms()  # the same connection refreshed again: nobody could take it
    assert not lease.blipped()
    assert lease.send_time_left_s() > (8000 - SAFETY_MARGIN_MS - 100) / 1000
