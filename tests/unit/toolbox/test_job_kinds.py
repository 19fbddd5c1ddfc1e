"""Job kinds are declared like tools (`@job`), found in the modules LIYAGENT_TOOLS and
LIYAGENT_JOB_MODULES name, and refused at load when declared wrong."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from liyagent.jobs.classifier_training import Example, NaiveBayes
from runtime.base.settings import Settings
from runtime.toolbox.job_kinds import JobContext, JobDeclarationError, JobError, JobParams, job
from runtime.toolbox.tool_sources import load_registry
from runtime.toolbox.tools import ToolDeclarationError
from tests.support.user_modules import importable_root, write_module

BUILT_IN = ["classifier_training", "fine_tune", "red_team", "source_sync"]


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A team's package outside the repository, importable like any installed module."""
    yield from importable_root(tmp_path, monkeypatch, "lyt_jobs")


JOB_MODULE = """
    from liyagent import JobContext, JobParams, job

    class Params(JobParams):
        n: int

    @job(kind="{kind}", resumable=True)
    def count_up(ctx: JobContext, params: Params) -> str:
        '''Count to n.'''
        return str(params.n)
"""


def test_a_module_of_jobs_alone_loads_with_its_kinds(user_package: Path) -> None:
    write_module(user_package, "lyt_jobs_a", JOB_MODULE.format(kind="acme.count"))
    registry = load_registry(["lyt_jobs_a"], use_entry_points=False)
    kind = registry.jobs["acme.count"]
    assert kind.resumable and kind.origin == "module lyt_jobs_a" and kind.tools == ()
    assert kind.check({"n": "3"}).model_dump() == {"n": 3}
    with pytest.raises(JobError, match=r"bad parameters \(n: Field required"):
        kind.check({})


def test_the_built_in_kinds_load_from_the_job_modules_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().job_modules == ("liyagent.jobs",)
    monkeypatch.delenv("LIYAGENT_JOB_MODULES", raising=False)
    assert Settings.from_env().job_modules == ("liyagent.jobs",)
    registry = load_registry([], job_modules=Settings().job_modules, use_entry_points=False)
    assert sorted(registry.jobs) == BUILT_IN
    assert [k for k in BUILT_IN if registry.jobs[k].resumable] == ["fine_tune", "source_sync"]
    assert registry.jobs["fine_tune"].tools == ("finetune.submit", "finetune.status")
    monkeypatch.setenv("LIYAGENT_JOB_MODULES", "")
    assert load_registry([], job_modules=Settings.from_env().job_modules).jobs == {}


def test_one_kind_declared_by_two_modules_stops_the_load(user_package: Path) -> None:
    write_module(user_package, "lyt_jobs_b", JOB_MODULE.format(kind="acme.count"))
    write_module(user_package, "lyt_jobs_c", JOB_MODULE.format(kind="acme.count"))
    with pytest.raises(ToolDeclarationError, match=r"job kind acme\.count is declared twice"):
        load_registry(["lyt_jobs_b", "lyt_jobs_c"], use_entry_points=False)
    # One module named twice is one declaration.
    assert list(load_registry(["lyt_jobs_b", "lyt_jobs_b"], use_entry_points=False).jobs) == [
        "acme.count"
    ]


def test_a_job_declared_without_a_params_model_stops_the_load(user_package: Path) -> None:
    write_module(
        user_package,
        "lyt_jobs_bad",
        """
        from liyagent import JobContext, job

        @job(kind="acme.bad")
        def bad(ctx: JobContext, params: dict) -> str:
            return ""
        """,
    )
    with pytest.raises(ToolDeclarationError) as info:
        load_registry(["lyt_jobs_bad"], use_entry_points=False)
    said = str(info.value)
    assert "LIYAGENT_TOOLS: module lyt_jobs_bad: job acme.bad" in said
    assert "P a JobParams model" in said


class P(JobParams):
    """No parameters."""


def test_a_kind_needs_a_name() -> None:
    def fn(ctx: JobContext, params: P) -> str:
        return ""

    with pytest.raises(JobDeclarationError, match="non-empty name"):
        job(kind=" ")(fn)
    assert job(kind="ok")(fn).params is P


def test_the_classifier_is_trained_and_scored() -> None:
    model = NaiveBayes()
    train = [
        Example(text="refund my order please", label="billing"),
        Example(text="charged twice refund", label="billing"),
        Example(text="site is down again", label="outage"),
        Example(text="checkout down errors", label="outage"),
    ]
    for example in train:
        model.learn(example)
    assert model.predict("please refund") == "billing"
    assert model.predict("the site is down") == "outage"
    assert model.accuracy(train) == 1.0
    assert model.accuracy([Example(text="down down", label="billing")]) == 0.0
    assert model.accuracy([]) is None
