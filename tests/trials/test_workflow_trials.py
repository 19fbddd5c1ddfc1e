"""The workflow trials (issue 36): Python workflows killed, redeployed and stopped for real,
judged from the vendor simulator's own records, never from the engine's.

- Kill trial: LIYAGENT_WORKFLOW_TRIALS runs of a workflow with a read, a gather of 20 keyed
  writes (each titled by its own step), a write with a reader and a signal wait; victim workers
  SIGKILLed at random moments (a survivor and beat recover them), the signal sent twice under
  one key while they die, and halfway the workflow's code redeployed with a step inserted.
  Judged: 0 lost, 0 duplicates (a title created twice, a comment made twice), 0 stale (a
  result paired with another step: a run's answer must list its own titles in order), each
  signal taken exactly once; the time from a kill to each lost run's resume (p50 <= 1.5 s).
- Stop trial: trees of 10 runs (a workflow, its child, theirs ...; the leaf writing), each
  root stopped: the time from the Stop to the last run of the tree ended (p95 <= 2 s), and
  the leaf's vendor requests after it (0 beyond the one in flight).

The short set runs in `make test`; `make trials` runs LIYAGENT_WORKFLOW_TRIALS=40.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.drifts import until
from tests.support.py_flows import SOURCE, install_flows

TRIALS = int(os.environ.get("LIYAGENT_WORKFLOW_TRIALS") or 6)
TREES = int(os.environ.get("LIYAGENT_WORKFLOW_TREES") or 3)
SEED = int(os.environ.get("LIYAGENT_KILL_SEED") or random.randrange(1 << 30))
GATHER = 20
# The code deployed halfway: a step inserted before the others, under a name of its own.
REDEPLOYED = SOURCE.replace(
    """        ticket = await ctx.call("ticket.read", {"ticket": "T-1"}, step="ticket")""",
    """        await ctx.step("inserted", lambda: "new code")
        ticket = await ctx.call("ticket.read", {"ticket": "T-1"}, step="ticket")""",
)


def _now(stack) -> Any:
    return stack.rows("SELECT clock_timestamp() AS now_at")[0].now_at


def _incident_titles(stack, run_id: str) -> Counter[str]:
    rows = stack.vendor(
        "SELECT body FROM sim.requests WHERE run_id = :r AND vendor = 'incidents' "
        "AND method = 'POST' AND status = 201",
        r=run_id,
    )
    return Counter(str(r.body["title"]) for r in rows)


def _signals(stack, runs: list[str], rng: random.Random, stop: threading.Event) -> None:
    """Send each run its `go` twice under one key, at random moments while workers die."""
    order = [*runs, *runs]
    rng.shuffle(order)
    for run_id in order:
        if stop.wait(rng.uniform(0.05, 0.4)):
            return
        stack.client.signal(run_id, "go", {"for": run_id}, key=f"go-{run_id}", by="trial")


@pytest.mark.kill
@pytest.mark.timeout(300 + TRIALS * 10)
def test_workflows_killed_and_redeployed_lose_nothing_and_never_mispair(
    stack, tmp_path: Path, monkeypatch, publish_figures
) -> None:
    stack.reconfigure(timings=replace(stack.settings.timings, loss_limit=50))
    install_flows(stack, tmp_path / "v1", monkeypatch)
    rng = random.Random(SEED)
    stack.beat()
    stack.worker("survivor", concurrency=4)  # its death watch and sweeps recover the victims'
    rounds = 2 + TRIALS // 10
    runs: list[str] = []
    kills: list[Any] = []

    def start(i: int) -> str:
        return str(
            stack.client.start_workflow(workflow="acme.trial", params={"tag": f"t{i}-{SEED}"})
        )

    def kill_round(name: str, during: Any = None) -> None:
        victim = stack.worker(name, concurrency=4)
        if during is not None:
            during()
        time.sleep(rng.uniform(0.3, 1.5))
        victim.kill()
        kills.append(_now(stack))

    # Rounds of starts, each victim killed while its runs' gathers are in flight; the code is
    # redeployed (a step inserted) halfway.
    for n in range(rounds):
        if n == rounds // 2:
            install_flows(stack, tmp_path / "v2", monkeypatch, source=REDEPLOYED)
        batch = range(n, TRIALS, rounds)
        kill_round(f"victim-{n}", lambda batch=batch: runs.extend(start(i) for i in batch))
    tags = {
        r: f"t{i}-{SEED}"
        for i, r in zip(
            [i for n in range(rounds) for i in range(n, TRIALS, rounds)], runs, strict=True
        )
    }
    # Then every run's signal, sent twice under one key at random moments while a last victim
    # dies.
    stop = threading.Event()
    sender = threading.Thread(target=_signals, args=(stack, runs, random.Random(SEED), stop))
    try:
        kill_round("victim-signals", sender.start)
        sender.join(timeout=120)
    finally:
        stop.set()
        sender.join(timeout=10)

    deadline = time.monotonic() + 120 + TRIALS * 3
    while time.monotonic() < deadline:
        views = {r: stack.client.get(r) for r in runs}
        if all(v.done for v in views.values()):
            break
        time.sleep(0.5)
    lost = [
        f"{r}: {v.status} {v.failure_reason}" for r, v in views.items() if v.status != "succeeded"
    ]
    assert lost == [], f"lost: {lost} (seed {SEED})"

    duplicates, stale = [], []
    for run_id, view in views.items():
        tag = tags[run_id]
        made = _incident_titles(stack, run_id)
        duplicates += [f"{run_id}: {t} x{n}" for t, n in made.items() if n > 1]
        if set(made) != {f"{tag}-{i}" for i in range(GATHER)}:
            stale.append(f"{run_id}: the vendor holds {sorted(made)}")
        answer = json.loads(view.answer or "{}")
        if answer["titles"] != [f"{tag}-{i}" for i in range(GATHER)]:
            stale.append(f"{run_id}: answered {answer['titles']}")
        if answer["go"] != {"for": run_id}:
            stale.append(f"{run_id}: took signal {answer['go']}")
        comments = stack.vendor(
            "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND path LIKE '/issues/%'",
            r=run_id,
        )[0].n
        if comments != 1:
            duplicates.append(f"{run_id}: {comments} comments")
    assert duplicates == [], f"duplicates: {duplicates} (seed {SEED})"
    assert stale == [], f"stale: {stale} (seed {SEED})"
    signals = stack.rows(
        "SELECT run_id, count(*) AS n, count(taken_by) AS taken FROM signals GROUP BY run_id"
    )
    assert {(str(s.run_id), s.n, s.taken) for s in signals} == {(r, 1, 1) for r in runs}

    resumed = stack.rows(
        "SELECT created_at FROM audit_events WHERE run_id = ANY(CAST(:r AS uuid[])) "
        "AND kind = 'agent.run.crash_resumed'",
        r=runs,
    )
    waits = [
        (e.created_at - max(k for k in kills if k <= e.created_at)).total_seconds()
        for e in resumed
        if any(k <= e.created_at for k in kills)
    ]
    assert waits, f"no kill caught a workflow in flight (seed {SEED})"
    p50 = statistics.median(waits)
    publish_figures.append(
        f"workflow kill trial ({TRIALS} runs of a {GATHER}-step gather, {rounds + 1} victims "
        f"SIGKILLed, code redeployed with a step inserted halfway, seed {SEED}): 0 lost, 0 "
        f"duplicate, 0 stale, {len(runs)} signals each taken once; {len(waits)} resumes, "
        f"kill to resume p50 {p50:.2f} s, max {max(waits):.2f} s"
    )


def _tree(stack) -> list[Any]:
    return stack.rows(
        "SELECT id, status, finished_at FROM runs WHERE agent = 'acme.nest' "
        "AND status <> 'succeeded' ORDER BY created_at"
    )


@pytest.mark.timeout(120 + TREES * 30)
def test_a_stop_ends_a_tree_of_ten_at_once_and_nothing_is_written_after(
    stack, tmp_path: Path, monkeypatch, publish_figures
) -> None:
    install_flows(stack, tmp_path / "v1", monkeypatch)
    stack.worker("w1", concurrency=12)
    ended: list[float] = []
    after = 0
    for n in range(TREES):
        root = stack.client.start_workflow(
            workflow="acme.nest", params={"depth": 9}, request_key=f"tree-{n}-{SEED}"
        )
        until(lambda: len([r for r in _tree(stack) if r.status != "failed"]) == 10, "ten runs")
        live = [r for r in _tree(stack) if r.status != "failed"]
        leaf = live[-1].id
        until(
            lambda leaf=leaf: sum(_incident_titles(stack, leaf).values()) >= 2,
            "the leaf writing",
        )
        sent = time.monotonic()
        stopped = stack.client.stop(run_id=root, reason="trial", by="ops")
        until(
            lambda live=live: all(stack.client.get(r.id).done for r in live),
            "the whole tree ended",
            timeout=10,
        )
        ended.append(time.monotonic() - sent)
        at = stack.vendor("SELECT clock_timestamp() AS now_at")[0].now_at
        assert sorted(stopped) == sorted(r.id for r in live)
        time.sleep(4)  # a heartbeat and more: the leaf's attempt lost its lease
        later = stack.vendor(
            "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND created_at > :t",
            r=leaf,
            t=at,
        )[0].n
        assert later <= 1, f"{later} requests after the Stop (seed {SEED})"
        after += later
    p95 = sorted(ended)[max(0, round(0.95 * len(ended)) - 1)]
    publish_figures.append(
        f"workflow stop trial ({TREES} trees of 10 runs, the leaf writing): Stop to the last "
        f"run ended p95 {p95:.3f} s (as polled every 0.1 s); {after} vendor requests of the "
        "leaves recorded after a Stop (at most the one in flight each), 0 runs went on"
    )
