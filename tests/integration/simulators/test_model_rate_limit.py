"""The model simulator's provider-like rate limit: past `requests` in a window, a 429 with
`Retry-After` and an OpenAI-shaped error body, recorded like any other answer; lifted, every
request is answered again."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa

from liyagent.local.sim_model import KEY, register


@pytest.fixture
def sim(simulator: tuple[str, sa.Engine]) -> Iterator[tuple[str, sa.Engine]]:
    yield simulator
    httpx.delete(f"{simulator[0]}/sim/model/limit", timeout=10).raise_for_status()


def _ask(url: str, model: str, run: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {KEY}", "X-Liyagent-Run": run}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=10)


def test_past_the_limit_the_model_answers_429_with_retry_after_and_records_it(sim) -> None:
    url, engine = sim
    model = register(url, [{"final": "ok"}])["model"]
    limit = {"requests": 2, "window_s": 600, "retry_after_s": 7}
    httpx.post(f"{url}/sim/model/limit", json=limit, timeout=10).raise_for_status()
    run = "rate-limit-run"
    statuses = [_ask(url, model, run).status_code for _ in range(2)]
    refused = _ask(url, model, run)
    assert statuses == [200, 200]
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "7"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    with engine.connect() as conn:
        recorded = conn.execute(
            sa.text("SELECT status FROM sim.requests WHERE run_id = :r ORDER BY id"), {"r": run}
        ).scalars()
        assert list(recorded) == [200, 200, 429]
    httpx.delete(f"{url}/sim/model/limit", timeout=10).raise_for_status()
    assert _ask(url, model, run).status_code == 200


def test_without_its_own_retry_after_it_says_the_seconds_left_in_the_window(sim) -> None:
    url, _ = sim
    model = register(url, [{"final": "ok"}])["model"]
    limit = {"requests": 0, "window_s": 30}
    httpx.post(f"{url}/sim/model/limit", json=limit, timeout=10).raise_for_status()
    refused = _ask(url, model, "switch-run")
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 30


def _tokens(url: str, engine: sa.Engine, run: str) -> list[tuple[int, int | None, int | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT status, prompt_tokens, completion_tokens FROM sim.requests "
                "WHERE run_id = :r ORDER BY id"
            ),
            {"r": run},
        )
        return [(r.status, r.prompt_tokens, r.completion_tokens) for r in rows]


def test_every_answer_reports_its_usage_and_the_record_keeps_it(sim) -> None:
    url, engine = sim
    model = register(url, [{"final": "Three words here."}])["model"]
    answer = _ask(url, model, "usage-run")
    usage = answer.json()["usage"]
    # "hi": 1 token, its message 3, the reply 3; "Three words here.": 4 tokens.
    assert usage == {
        "prompt_tokens": 7,
        "completion_tokens": 4,
        "total_tokens": 11,
        # OpenAI's details: none cached unless the step says so; nothing else modelled.
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    assert _tokens(url, engine, "usage-run") == [(200, 7, 4)]


def test_a_prompt_cache_hit_is_reported_and_recorded_at_most_the_prompt(sim) -> None:
    url, engine = sim
    model = register(url, [{"final": "Cached.", "cached_tokens": 5}])["model"]
    assert _ask(url, model, "cached-run").json()["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 5,
        "audio_tokens": 0,
    }
    many = register(url, [{"final": "All of it.", "cached_tokens": 10_000}])["model"]
    usage = _ask(url, many, "cached-all").json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]
    with engine.connect() as conn:
        cached = conn.execute(
            sa.text(
                "SELECT run_id, cached_tokens FROM sim.requests "
                "WHERE run_id IN ('cached-run', 'cached-all') ORDER BY id"
            )
        ).all()
    assert [tuple(r) for r in cached] == [("cached-run", 5), ("cached-all", 7)]
    bad = httpx.post(f"{url}/v1/scripts", json={"steps": [{"final": "x", "cached_tokens": -1}]})
    assert bad.status_code == 400 and "cached_tokens" in bad.text


def test_past_a_token_limit_the_model_answers_429_charging_nothing_and_refills(sim) -> None:
    url, engine = sim
    model = register(url, [{"final": "Three words here."}])["model"]
    # 11 tokens an answer; 25 a 2 s window: two answers fit the full bucket, the third does not.
    limit = {"tokens": 25, "window_s": 2}
    httpx.post(f"{url}/sim/model/limit", json=limit, timeout=10).raise_for_status()
    run = "tokens-run"
    statuses = [_ask(url, model, run).status_code for _ in range(2)]
    refused = _ask(url, model, run)
    assert statuses == [200, 200]
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"  # at most 11 short at 12.5 a second
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    # 22 used, less what refilled since (the requests took a moment).
    assert re.search(r"Limit 25, Used (1[4-9]|2[0-2]), Requested 11\.", error["message"])
    assert _tokens(url, engine, run)[2] == (429, None, None)
    time.sleep(1.0)  # the bucket refills at 12.5 tokens a second: 11 fit again
    assert _ask(url, model, run).status_code == 200


def test_input_and_output_tokens_are_limited_apart(sim) -> None:
    url, _ = sim
    model = register(url, [{"final": "Three words here."}])["model"]
    # 7 input and 4 output tokens an answer: the output limit (6 a minute) bites first.
    limit = {"input_tokens": 100, "output_tokens": 6, "window_s": 60}
    httpx.post(f"{url}/sim/model/limit", json=limit, timeout=10).raise_for_status()
    assert _ask(url, model, "apart-run").status_code == 200
    refused = _ask(url, model, "apart-run")
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "output_tokens"
    # 2 tokens short at 6 a minute: 20 s.
    assert refused.headers["retry-after"] == "20"


def test_a_request_larger_than_the_whole_bucket_is_too_large(sim) -> None:
    url, _ = sim
    model = register(url, [{"final": "Three words here."}])["model"]
    httpx.post(
        f"{url}/sim/model/limit", json={"input_tokens": 5, "window_s": 60}, timeout=10
    ).raise_for_status()
    refused = _ask(url, model, "large-run")
    assert refused.status_code == 429
    assert refused.json()["error"]["message"].startswith("Request too large")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"window_s": 10}, "requests"),
        ({"tokens": 0}, "tokens"),
        ({"input_tokens": 1.5}, "input_tokens"),
        ({"output_tokens": "9"}, "output_tokens"),
        ({"tokens": True}, "tokens"),
        ({"tokens": 10, "window_s": 0}, "window_s"),
        ({"tokens": 10, "retry_after_s": -1}, "retry_after_s"),
    ],
)
def test_a_bad_limit_is_refused_400_naming_the_field(sim, body, field) -> None:
    url, _ = sim
    answer = httpx.post(f"{url}/sim/model/limit", json=body, timeout=10)
    assert answer.status_code == 400
    assert field in answer.json()["error"]
