"""One base for the errors a caller catches: `except liyagent.LiyagentError` catches every
error liyagent raises for its caller (each still the builtin kind it was, `ValueError` for a bad
request), while the engine's own control flow (a wait, a hand-back, a fenced-out write) is not
one of them."""

from __future__ import annotations

import pytest

import liyagent
from runtime.base.config import ConfigError
from runtime.base.sealing import NoSealKeys, SealError
from runtime.core.catalog import CatalogError
from runtime.core.enqueue import RequestConflict
from runtime.core.waiting import Suspend
from runtime.entries.start import UnknownAgent
from runtime.models.base import ModelError
from runtime.models.profiles import parse
from runtime.models.specs import ModelSpecError, check
from runtime.ops.erasure import OwnerNotFound
from runtime.toolbox.tools import ToolDeclarationError, ToolError, ToolInDoubt
from store.rows import RequestKeyConflict, RunNotFound


@pytest.mark.parametrize(
    "kind",
    [
        liyagent.BadRequest,
        RequestConflict,
        UnknownAgent,
        RunNotFound,
        RequestKeyConflict,
        OwnerNotFound,
        ConfigError,
        NoSealKeys,
        SealError,
        CatalogError,
        ModelError,
        ModelSpecError,
        ToolError,
        ToolInDoubt,
        ToolDeclarationError,
        liyagent.JobError,
        liyagent.OutputMismatch,
        liyagent.SendRefused,
    ],
)
def test_every_error_for_a_caller_is_a_liyagent_error(kind: type) -> None:
    assert issubclass(kind, liyagent.LiyagentError)


def test_one_except_catches_a_refusal_and_it_keeps_its_builtin_kind() -> None:
    with pytest.raises(liyagent.LiyagentError) as info:
        check({"provider": "opnai"}, parse(""))
    assert isinstance(info.value, ModelError) and "not a known provider" in str(info.value)
    assert issubclass(liyagent.BadRequest, ValueError) and issubclass(RunNotFound, RuntimeError)


def test_the_engines_control_flow_is_not_for_callers() -> None:
    """A wait ends an attempt inside the engine; no caller sees one."""
    assert not issubclass(Suspend, liyagent.LiyagentError)
