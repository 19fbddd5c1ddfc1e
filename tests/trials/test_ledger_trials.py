"""The ledger kill trials (issue 34): the kill trials' rounds (a fresh victim SIGKILLed 0.2-4 s
after it is up while it runs cron fires, Teams turns and webhook calls; a survivor and beat
recover), judged by what the model server itself billed: the simulators' model records every
request with the run, attempt and step its headers name and the tokens it billed
(`sim.requests`: prompt_tokens, completion_tokens, cached_tokens).

Held, for every run:
- each written step's usage (its step record's, or its final answer's) is exactly what the
  server billed for the request that produced it (its writer attempt's request of that step;
  a final answer's: the last billed request of its step, since no step is asked again once its
  answer is written, I5);
- every billed request of an attempt that did not write its step (a lost attempt's) is covered
  by unconfirmed usage recorded for that attempt and step: its input and output at least what
  was billed;
- nothing is counted twice: no unconfirmed row for a step its own attempt wrote, each billed
  request counted exact at most once, and the run's view (`client().get(run_id).usage`) sums
  exactly the written steps' billed tokens, the unconfirmed rows apart.

Plus the kill trials' own verdict, unweakened. A short set runs in `make test`;
`make trials` runs LIYAGENT_LEDGER_TRIALS=60.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from liyagent.local.trials import TrialDeployment, TrialOptions, run_trials
from liyagent.local.verdict import summary_line
from runtime.ops.run_view import read_view
from tests.support.trial_setup import trial_deployment

TRIALS = int(os.environ.get("LIYAGENT_LEDGER_TRIALS") or 12)

Key = tuple[str, int, int]  # run id, attempt, step


def _billed(vendor: sa.Engine) -> dict[str, list[tuple[int, int, int, int, int, int]]]:
    """Every model response the server billed, by run, in order: (id, attempt, step, prompt,
    completion, cached)."""
    with vendor.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT id, run_id, attempt, call, prompt_tokens, completion_tokens, "
                "coalesce(cached_tokens, 0) AS cached FROM sim.requests "
                "WHERE vendor = 'model' AND status = 200 AND run_id IS NOT NULL ORDER BY id"
            )
        ).all()
    out: dict[str, list[tuple[int, int, int, int, int, int]]] = defaultdict(list)
    for r in rows:
        out[str(r.run_id)].append(
            (r.id, int(r.attempt), int(r.call), r.prompt_tokens, r.completion_tokens, r.cached)
        )
    return out


def _written(engine: sa.Engine) -> dict[str, dict[int, tuple[int | None, tuple[int, int, int]]]]:
    """Each run's written steps: step -> (writer attempt, or None for a final answer's;
    (input, output, cached) as recorded)."""
    with engine.connect() as conn:
        steps = conn.execute(
            sa.text(
                "SELECT run_id, step, attempt, input_tokens, output_tokens, cached_tokens "
                "FROM run_steps"
            )
        ).all()
        answers = conn.execute(
            sa.text(
                "SELECT id, step, answer_input_tokens, answer_output_tokens, "
                "answer_cached_tokens FROM runs WHERE answer_input_tokens IS NOT NULL"
            )
        ).all()
    out: dict[str, dict[int, tuple[int | None, tuple[int, int, int]]]] = defaultdict(dict)
    for s in steps:
        out[str(s.run_id)][s.step] = (s.attempt, (s.input_tokens, s.output_tokens, s.cached_tokens))
    for a in answers:
        out[str(a.id)][a.step + 1] = (None, (a[2], a[3], a[4]))
    return out


def _unconfirmed(engine: sa.Engine) -> dict[Key, tuple[int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT run_id, attempt, step, input_tokens, output_tokens FROM usage_unconfirmed"
            )
        ).all()
    return {(str(r.run_id), r.attempt, r.step): (r.input_tokens, r.output_tokens) for r in rows}


def judge_ledger(engine: sa.Engine, vendor: sa.Engine) -> dict[str, Any]:
    """The ledger against the server's bills; the problems found (none when it holds)."""
    billed, written, unconfirmed = _billed(vendor), _written(engine), _unconfirmed(engine)
    problems: list[str] = []
    exact_counted: set[int] = set()
    lost_requests = covered = 0
    for run_id in set(billed) | set(written):
        requests = billed.get(run_id, [])
        steps = written.get(run_id, {})
        producers: dict[int, int] = {}  # step -> the billed request's id it was written from
        for step, (writer, usage) in steps.items():
            of_step = [r for r in requests if r[2] == step]
            if writer is not None:
                of_step = [r for r in of_step if r[1] == writer]
            if not of_step:
                problems.append(f"{run_id} step {step}: written, but no billed request made it")
                continue
            producer = of_step[-1]
            producers[step] = producer[0]
            if usage != producer[3:]:
                problems.append(f"{run_id} step {step}: recorded {usage}, billed {producer[3:]}")
            if producer[0] in exact_counted:
                problems.append(f"{run_id} step {step}: billed request counted twice")
            exact_counted.add(producer[0])
        for rid, attempt, step, prompt, completion, _ in requests:
            if producers.get(step) == rid:
                continue
            lost_requests += 1
            noted = unconfirmed.get((run_id, attempt, step))
            if noted is None or noted[0] < prompt or noted[1] < completion:
                problems.append(
                    f"{run_id} attempt {attempt} step {step}: billed ({prompt}, {completion}) "
                    f"not covered by unconfirmed usage {noted}"
                )
            else:
                covered += 1
        for (rid, attempt, step), _ in unconfirmed.items():
            if rid == run_id and step in steps and steps[step][0] == attempt:
                problems.append(f"{run_id} attempt {attempt} step {step}: written and unconfirmed")
    return {
        "problems": problems,
        "runs": len(set(billed) | set(written)),
        "written_steps": len(exact_counted),
        "lost_requests": lost_requests,
        "covered": covered,
        "unconfirmed_rows": len(unconfirmed),
    }


def _views_agree(deployment: TrialDeployment, run_ids: list[str]) -> list[str]:
    """Each run's view sums its written steps' recorded usage, and its unconfirmed apart."""
    problems = []
    engine = deployment.services.engine
    for run_id in run_ids:
        view = read_view(engine, deployment.sealer, run_id)
        with engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    "SELECT (SELECT coalesce(sum(input_tokens), 0) FROM run_steps WHERE "
                    "run_id = :r) + (SELECT coalesce(answer_input_tokens, 0) FROM runs WHERE "
                    "id = :r) AS exact, (SELECT coalesce(sum(input_tokens), 0) FROM "
                    "usage_unconfirmed WHERE run_id = :r) AS unconfirmed"
                ),
                {"r": run_id},
            ).one()
        seen = (view.usage.input_tokens, view.usage.unconfirmed_input_tokens)
        if seen != (row.exact, row.unconfirmed):
            problems.append(f"{run_id}: view {seen}, rows {(row.exact, row.unconfirmed)}")
    return problems


@pytest.mark.kill
@pytest.mark.timeout(300 + TRIALS * 4)
def test_ledger_kill_trials(
    servers, db_url, namespace, seal_keys, tmp_path: Path, publish_figures: list[str]
) -> None:
    # Kills early in each round, while its runs (a step every 400 ms) are in flight: over the
    # default window (up to 4 s) the 4 rounds of `make test` once all landed after their runs
    # had ended, and the trial judged nothing in flight.
    options = TrialOptions(trials=TRIALS, pool="prefork", kill_window_s=(0.2, 1.5))
    with trial_deployment(servers, db_url, namespace, seal_keys, tmp_path, "ledger") as deployment:
        vendor = sa.create_engine(deployment.vendor_db_url, hide_parameters=True)
        try:
            deployment.start(options)
            verdict = run_trials(deployment, options)
            found = judge_ledger(deployment.services.engine, vendor)
            with deployment.services.engine.connect() as conn:
                run_ids = [str(r.id) for r in conn.execute(sa.text("SELECT id FROM runs")).all()]
            disagree = _views_agree(deployment, run_ids)
        finally:
            vendor.dispose()
    publish_figures.append(
        f"ledger trials: {summary_line(verdict)}; {found['runs']} runs, {found['written_steps']} "
        f"written steps exact, {found['covered']}/{found['lost_requests']} lost billed requests "
        f"covered by unconfirmed usage ({found['unconfirmed_rows']} unconfirmed rows)"
    )
    assert verdict.lost == [], f"lost trials: {verdict.lost} (seed {verdict.seed})"
    assert verdict.duplicates == 0, f"duplicate writes {verdict.duplicate_writes}"
    assert verdict.stale_writes == 0, f"written after a takeover: {verdict.stale_detail}"
    assert verdict.caught_in_flight > 0, "no victim had work in flight when it died"
    assert found["problems"] == [], found["problems"][:20]
    assert found["written_steps"] > 0
    assert disagree == [], disagree[:20]
