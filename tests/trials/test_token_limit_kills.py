"""The kill trials under a saturated endpoint (issue 33): the kill trials' rounds (a fresh
victim SIGKILLed 0.2-4 s after it is up, while it runs cron fires, Teams turns and webhook
calls; a survivor and beat recover), while the model endpoint they all ask is held at its
limit: the simulator limits its input tokens a minute as a provider does, the profile declares
the same limit, and a loader worker's runs ask twice it throughout. The victims' steps wait for
capacity (in place, or suspended) when they are killed as often as they are asked.

The kill trials' own checks, unweakened: no trial lost, no duplicate write, no stale write, some
trial caught in flight. The claim of a lost run does not wait for the endpoint, so each trial
caught in flight is resumed (its next attempt claimed) within the kill trials' 15 s; its end
also waits its turn for the endpoint's capacity, so it is held to 15 s plus two minutes of the
endpoint's refill (the load asks twice the limit throughout), not to 15 s. The load's
own runs all succeed, no step of theirs asked twice, and the endpoint was held at its limit
(the model server's records: tokens answered while the rounds ran against its refill).

The short set runs in `make test`, under the prefork pool; `make trials` runs
LIYAGENT_TPM_KILL_TRIALS=30 under each pool (prefork and threads: the thread pool's kill trials
at an idle endpoint run in `make test`, tests/trials/test_kill_trials.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from celery import Celery

import celeryconfig
from liyagent.local.cluster import POOLS
from liyagent.local.sim_model import register
from liyagent.local.token_load import SCRIPT, Load
from liyagent.local.trials import TrialDeployment, TrialOptions, run_trials
from liyagent.local.verdict import RECOVERY_BOUND_S, summary_line
from runtime import services as runtime_services
from runtime.entries.client import Client
from tasks.services import CeleryPublisher
from tests.support.trial_setup import trial_deployment

TRIALS = int(os.environ.get("LIYAGENT_TPM_KILL_TRIALS") or 9)
# `make trials` (the variable set): each pool; `make test`: prefork.
TRIAL_POOLS = POOLS if os.environ.get("LIYAGENT_TPM_KILL_TRIALS") else ("prefork",)
# A lost run's claim waits for nothing: the kill trials' bound. Its end waits its turn for the
# endpoint's capacity too: that bound plus two minutes of the endpoint's refill.
RESUME_BOUND_S = RECOVERY_BOUND_S
END_BOUND_S = RECOVERY_BOUND_S + 120
# Input tokens a minute, the provider's and the profile's: the load alone asks twice it.
LIMIT = 12_000
# A load run's input tokens as the simulator counts them (tests/trials/test_token_limit.py
# measures it: 489); the figure below says what the load really asked.
PER_RUN = 489
# How long the load's own runs may take to end after the trials drained (they drain meanwhile):
# within the test's timeout, so a stuck run fails the test with its state printed.
LOAD_DRAIN_S = 120


def _loader(deployment: TrialDeployment, pool: str) -> Load:
    """A worker of its own for the load (never killed), and a client that starts its runs on
    that worker's queue."""
    queue = f"{deployment.settings.queue}.load"
    deployment.cluster.worker(
        "loader", queue, deployment.victim_env(), concurrency=6, ops=False, pool=pool
    )
    settings = replace(deployment.settings, queue=queue)
    app = Celery("liyagent-load", set_as_current=False)
    app.conf.update(celeryconfig.config_for(settings))
    services = runtime_services.build(
        settings,
        CeleryPublisher(app, queue, settings.resumed_first),
        sealer=deployment.sealer,
    )
    model = register(deployment.settings.vendor_url, SCRIPT)
    return Load(Client(services), model, LIMIT, PER_RUN)


@pytest.mark.kill
@pytest.mark.timeout(420 + TRIALS * 8)
@pytest.mark.parametrize("pool", TRIAL_POOLS)
def test_kill_trials_while_the_endpoint_is_held_at_its_limit(
    servers,
    db_url,
    namespace,
    seal_keys,
    tmp_path: Path,
    publish_figures: list[str],
    pool: str,
) -> None:
    options = TrialOptions(
        trials=TRIALS,
        pool=pool,
        limits={"input_tokens_per_minute": LIMIT},
        sim_limit={"input_tokens": LIMIT, "window_s": 60},
        drain_timeout_s=240.0,
    )
    with trial_deployment(servers, db_url, namespace, seal_keys, tmp_path, "tpm") as deployment:
        vendor = sa.create_engine(deployment.vendor_db_url, hide_parameters=True)
        try:
            deployment.start(options)
            load = _loader(deployment, options.pool)
            offering = load.offer()
            with vendor.connect() as vconn:
                _bucket_spent(vconn)
            rounds: list[datetime] = [datetime.now(tz=UTC)]
            try:
                # The rounds' span: from the first victim's start to the last kill.
                verdict = run_trials(
                    deployment, options, on_round=lambda *_: rounds.append(datetime.now(tz=UTC))
                )
            finally:
                load.stop.set()
                offering.join()
            with deployment.services.engine.connect() as conn:
                ended = _load_ended(conn, load.runs, timeout_s=LOAD_DRAIN_S)
            with vendor.connect() as vconn:
                held, asked_twice, refused, sent = _endpoint(
                    vconn, load.runs, rounds[0], rounds[-1]
                )
        finally:
            vendor.dispose()
    publish_figures.append(
        f"kill trials at the token limit ({LIMIT} input tokens a minute, load {len(load.runs)} "
        f"runs at 2x): {summary_line(verdict)}; tokens answered while the rounds ran "
        f"{held:.0%} of the limit's refill; 429s {refused} of {sent} requests"
    )
    assert verdict.lost == [], f"lost trials: {verdict.lost} (seed {verdict.seed})"
    assert verdict.duplicates == 0, f"duplicate writes {verdict.duplicate_writes}"
    assert verdict.stale_writes == 0, f"written after a takeover: {verdict.stale_detail}"
    assert verdict.caught_in_flight > 0, "no victim had work in flight when it died"
    late = [r for r in verdict.recoveries if (r.resume_seconds or 0) > RESUME_BOUND_S]
    assert late == [], f"resumed later than {RESUME_BOUND_S:g} s after the kill: {late}"
    slow = verdict.slow(END_BOUND_S)
    assert slow == [], f"ended later than {END_BOUND_S:g} s after the kill: {slow}"
    assert ended == {"succeeded": len(load.runs)}, f"the load's runs ended {ended}"
    assert asked_twice == [], f"load runs with a step asked twice (I5): {asked_twice}"
    assert held >= 0.9, f"the endpoint was not held at its limit: {held:.0%} of its refill"


def _bucket_spent(vconn: sa.Connection, timeout_s: float = 60) -> None:
    """Wait until the load has spent the endpoint's full bucket (what a minute of idleness
    leaves): from then on it is held at its limit."""
    deadline = time.monotonic() + timeout_s
    while True:
        (tokens,) = vconn.execute(
            sa.text("SELECT coalesce(sum(prompt_tokens), 0) FROM sim.requests WHERE status = 200")
        ).one()
        if tokens >= LIMIT:
            return
        assert time.monotonic() < deadline, f"the load spent only {tokens} of {LIMIT} tokens"
        vconn.commit()
        time.sleep(0.2)


def _load_ended(conn: sa.Connection, runs: list[str], timeout_s: float) -> dict[str, int]:
    """How the load's runs ended, once none is left running (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = conn.execute(
            sa.text(
                "SELECT status, count(*) AS n FROM runs WHERE id = ANY(CAST(:ids AS uuid[])) "
                "GROUP BY status"
            ),
            {"ids": runs},
        ).all()
        ended = {r.status: r.n for r in rows}
        if set(ended) <= {"succeeded", "failed"} or time.monotonic() > deadline:
            return ended
        conn.commit()
        time.sleep(0.5)


def _endpoint(
    vconn: sa.Connection, load_runs: list[str], first: datetime, last: datetime
) -> tuple[float, list[str], int, int]:
    """From the model server's records: input tokens answered (every run's) while the rounds
    ran, against the limit's refill over that span; the load's runs with a step answered
    twice; the 429s and the requests in all."""
    (tokens,) = vconn.execute(
        sa.text(
            "SELECT coalesce(sum(prompt_tokens), 0) FROM sim.requests WHERE vendor = 'model' "
            "AND status = 200 AND created_at BETWEEN :a AND :b"
        ),
        {"a": first, "b": last},
    ).one()
    span = (last - first).total_seconds()
    twice = vconn.execute(
        sa.text(
            "SELECT DISTINCT run_id FROM sim.requests WHERE vendor = 'model' AND status = 200 "
            "AND run_id = ANY(:runs) GROUP BY run_id, call HAVING count(*) > 1"
        ),
        {"runs": load_runs},
    ).scalars()
    refused, sent = vconn.execute(
        sa.text(
            "SELECT count(*) FILTER (WHERE status = 429), count(*) FROM sim.requests "
            "WHERE vendor = 'model' AND method = 'POST'"
        )
    ).one()
    return float(tokens) / (LIMIT * span / 60), list(twice), int(refused), int(sent)
