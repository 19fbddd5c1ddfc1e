"""The typed run request: keyword fields validated once at the door, a bad one named."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.core.enqueue import BadRequest, RunRequest
from runtime.models.profiles import BUILT_IN
from store.schema import metadata
from store.states import ApprovalStatus, MarkStatus, RunStatus

SCRIPT = {"provider": "scripted", "script": {"steps": [{"final": "done"}]}}


def _fields(**over: Any) -> dict[str, Any]:
    return {"agent": "support-bot", "model": SCRIPT, "user_input": "hi", **over}


def test_keywords_become_the_run_to_enqueue_with_the_model_as_given() -> None:
    new = RunRequest.parse(_fields(tools=("ticket.read",), request_key="k-1"), BUILT_IN).new_run()
    assert new.model == SCRIPT and new.tools == ["ticket.read"] and new.request_key == "k-1"
    assert new.checked_model is not None  # checked at the door, not again by enqueue


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"tool": ["ticket.read"]}, "tool: Extra inputs are not permitted"),
        ({"tools": "ticket.read"}, "tools: Input should be a valid list"),
        ({"user_input": 7}, "user_input: Input should be a valid string"),
        ({"may_wait": "yes"}, "may_wait: Input should be a valid boolean"),
        ({"agent": "a b"}, "agent name 'a b' must be"),
        ({"model": {"provider": "opnai"}}, "model.provider 'opnai' is not a known provider"),
    ],
)
def test_a_bad_field_is_a_bad_request_naming_it(over: dict[str, Any], says: str) -> None:
    with pytest.raises(BadRequest) as info:
        RunRequest.parse(_fields(**over), BUILT_IN)
    assert says in str(info.value) and "nothing was stored" in str(info.value)


def test_a_secret_in_the_model_is_named_never_repeated() -> None:
    secret = "sk-live-0123456789"
    with pytest.raises(BadRequest) as info:
        RunRequest.parse(
            _fields(model={"provider": "openai", "model": "m", "api_key": secret}), BUILT_IN
        )
    assert "model.api_key" in str(info.value) and secret not in str(info.value)


@pytest.mark.parametrize(
    ("table", "states"),
    [("runs", RunStatus), ("call_marks", MarkStatus), ("approvals", ApprovalStatus)],
)
def test_every_state_is_one_the_schema_allows(table: str, states: Any) -> None:
    [check] = [
        str(c.sqltext)
        for c in metadata.tables[table].constraints
        if c.name == f"ck_{table}_status" and hasattr(c, "sqltext")
    ]
    assert all(f"'{s.value}'" in check for s in states)
