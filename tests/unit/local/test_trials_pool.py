"""The kill trials' report names the Celery pool they ran under (JSON, HTML and the summary),
and the harness starts its workers under that pool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from liyagent.local.cluster import POOLS, worker_argv
from liyagent.local.trials import TrialOptions
from liyagent.local.verdict import Verdict, report_extra, summary_line, write_report
from runtime.base.settings import Timings


@pytest.mark.parametrize("pool", POOLS)
def test_the_trials_report_names_its_pool(tmp_path: Path, pool: str) -> None:
    verdict = Verdict(trials=3, rounds=1, caught_in_flight=1, recovery_s=[2.5], pool=pool)
    path = tmp_path / "trials.json"
    write_report(verdict, path, report_extra(Timings(), TrialOptions(pool=pool)))
    body = json.loads(path.read_text())
    assert body["pool"] == pool
    assert summary_line(verdict).startswith(f"pool {pool}, trials 3")
    assert f"pool {pool}, trials 3" in path.with_suffix(".html").read_text()


@pytest.mark.parametrize("pool", POOLS)
def test_the_harness_starts_workers_under_its_pool(pool: str) -> None:
    argv = worker_argv("victim-0", "q", 3, pool=pool)
    assert argv[argv.index("-P") + 1] == pool
