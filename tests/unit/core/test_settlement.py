"""The spec's "Writes in flight" table as a decision per call kind (I2, I7)."""

from __future__ import annotations

import pytest

from runtime.core.settlement import MarkFacts, decide
from runtime.toolbox.tools import ToolKind
from store.states import MarkStatus, Settle

BOUND = 3600.0


def doubt(kind: ToolKind, stable: bool = True, age: float = 10.0) -> MarkFacts:
    return MarkFacts(kind=kind, status=MarkStatus.IN_DOUBT, stable_key=stable, age_s=age)


def test_read_is_made_again() -> None:
    assert (
        decide(
            kind_now=ToolKind.READ,
            mark=None,
            has_reader=False,
            dedupe_window_s=None,
            resume_bound_s=BOUND,
        )
        is Settle.MAKE
    )


def test_unmarked_write_was_never_sent_so_it_is_made() -> None:
    assert (
        decide(
            kind_now=ToolKind.WRITE,
            mark=None,
            has_reader=False,
            dedupe_window_s=None,
            resume_bound_s=BOUND,
        )
        is Settle.MAKE
    )


@pytest.mark.parametrize("status", [MarkStatus.DONE, MarkStatus.SETTLED, MarkStatus.FAILED])
def test_recorded_outcome_is_reused(status: MarkStatus) -> None:
    mark = MarkFacts(ToolKind.WRITE, status, True, 5.0)
    assert (
        decide(
            kind_now=ToolKind.WRITE,
            mark=mark,
            has_reader=True,
            dedupe_window_s=None,
            resume_bound_s=BOUND,
        )
        is Settle.REUSE
    )


def test_keyed_write_with_long_window_is_resent_with_its_key() -> None:
    assert (
        decide(
            kind_now=ToolKind.KEYED_WRITE,
            mark=doubt(ToolKind.KEYED_WRITE),
            has_reader=False,
            dedupe_window_s=86400,
            resume_bound_s=BOUND,
        )
        is Settle.RESEND
    )


def test_keyed_write_with_short_window_is_not_resent() -> None:
    assert (
        decide(
            kind_now=ToolKind.KEYED_WRITE,
            mark=doubt(ToolKind.KEYED_WRITE),
            has_reader=False,
            dedupe_window_s=300,
            resume_bound_s=BOUND,
        )
        is Settle.UNKNOWN
    )


def test_keyed_write_past_its_window_is_not_resent() -> None:
    mark = doubt(ToolKind.KEYED_WRITE, age=90000)
    assert (
        decide(
            kind_now=ToolKind.KEYED_WRITE,
            mark=mark,
            has_reader=False,
            dedupe_window_s=86400,
            resume_bound_s=BOUND,
        )
        is Settle.UNKNOWN
    )


def test_keyed_write_without_stable_key_is_not_resent() -> None:
    mark = doubt(ToolKind.KEYED_WRITE, stable=False)
    assert (
        decide(
            kind_now=ToolKind.KEYED_WRITE,
            mark=mark,
            has_reader=False,
            dedupe_window_s=86400,
            resume_bound_s=BOUND,
        )
        is Settle.UNKNOWN
    )


def test_write_with_reader_is_read_back() -> None:
    assert (
        decide(
            kind_now=ToolKind.WRITE,
            mark=doubt(ToolKind.WRITE),
            has_reader=True,
            dedupe_window_s=None,
            resume_bound_s=BOUND,
        )
        is Settle.READ_BACK
    )


def test_other_write_is_unknown() -> None:
    assert (
        decide(
            kind_now=ToolKind.WRITE,
            mark=doubt(ToolKind.WRITE),
            has_reader=False,
            dedupe_window_s=None,
            resume_bound_s=BOUND,
        )
        is Settle.UNKNOWN
    )


def test_write_reclassified_as_read_stays_a_write() -> None:
    assert (
        decide(
            kind_now=ToolKind.READ,
            mark=doubt(ToolKind.WRITE),
            has_reader=False,
            dedupe_window_s=None,
            resume_bound_s=BOUND,
        )
        is Settle.UNKNOWN
    )


def test_missing_tool_in_doubt_is_unknown() -> None:
    assert (
        decide(
            kind_now=None,
            mark=doubt(ToolKind.WRITE),
            has_reader=False,
            dedupe_window_s=None,
            resume_bound_s=BOUND,
        )
        is Settle.UNKNOWN
    )


def test_approved_call_in_doubt_is_resent_with_its_approval_id_if_the_vendor_dedupes() -> None:
    assert (
        decide(
            kind_now=ToolKind.APPROVAL_WRITE,
            mark=doubt(ToolKind.APPROVAL_WRITE),
            has_reader=False,
            dedupe_window_s=86400,
            resume_bound_s=BOUND,
        )
        is Settle.RESEND
    )


def test_approved_call_in_doubt_without_dedupe_is_read_back_or_unknown() -> None:
    assert (
        decide(
            kind_now=ToolKind.APPROVAL_WRITE,
            mark=doubt(ToolKind.APPROVAL_WRITE),
            has_reader=True,
            dedupe_window_s=None,
            resume_bound_s=BOUND,
        )
        is Settle.READ_BACK
    )
    assert (
        decide(
            kind_now=ToolKind.APPROVAL_WRITE,
            mark=doubt(ToolKind.APPROVAL_WRITE),
            has_reader=False,
            dedupe_window_s=None,
            resume_bound_s=BOUND,
        )
        is Settle.UNKNOWN
    )


def test_remote_agent_in_doubt_is_read_back() -> None:
    assert (
        decide(
            kind_now=ToolKind.REMOTE_AGENT,
            mark=doubt(ToolKind.REMOTE_AGENT),
            has_reader=True,
            dedupe_window_s=None,
            resume_bound_s=BOUND,
        )
        is Settle.READ_BACK
    )
