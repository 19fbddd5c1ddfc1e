"""The vendor simulators as a real subprocess on loopback, judged from their Postgres records.

Each module run gets a throwaway database; two simulator processes start against it at once
(one with the default incident and notify dedupe windows and source corpus, one with 1 s
windows and a 7-document corpus).
"""

from __future__ import annotations

import hashlib
import json
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from sqlalchemy import Engine, text

from simulators.vendor import (
    a2a_tasks_by_id,
    chat_replies_by_key,
    comments_by_key,
    connector_posts_by_key,
    count_requests,
    fine_tunes_by_key,
    incidents_by_key,
    make_engine,
    notifications_by_key,
    serve,
    source_doc,
    stop,
)

ROOT = Path(__file__).resolve().parents[3]
PG = "postgresql://postgres@127.0.0.1:5432"
SHORT_SOURCE_DOCS = 7
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


@dataclass
class Simulator:
    """A running simulator subprocess and an HTTP client bound to it."""

    proc: subprocess.Popen[str]
    url: str
    client: httpx.Client
    log: Path


def new_key() -> str:
    return "test-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    name = "sim_test_" + secrets.token_hex(6)
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[Engine]:
    eng = make_engine(database_url)
    yield eng
    eng.dispose()


def _spawn(database_url: str, log: Path, *extra: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "simulators", "--port", "0", "--database-url", database_url]
    with log.open("w") as stderr:
        return subprocess.Popen(
            [*args, *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True
        )


def _first_line(proc: subprocess.Popen[str], log: Path) -> str:
    """The simulator's first stdout line, waited for at most START_TIMEOUT_S."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=START_TIMEOUT_S)
    except queue.Empty:
        line = ""
    prefix = "simulators listening on "
    if not line.startswith(prefix):
        _terminate(proc)
        pytest.fail(f"simulator did not start: {line!r}\n{log.read_text()}")
    return line[len(prefix) :].strip()


def _terminate(proc: subprocess.Popen[str]) -> int:
    """SIGTERM the simulator and return its exit code (SIGKILL if it does not stop in time)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait(STOP_TIMEOUT_S)
    if proc.stdout is not None:
        proc.stdout.close()
    return code


@pytest.fixture(scope="module")
def simulators(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Simulator, Simulator]]:
    logs = tmp_path_factory.mktemp("simulators")
    long_log, short_log = logs / "default.log", logs / "short.log"
    # Started together on purpose: two processes racing to create the `sim` schema.
    procs = [
        _spawn(database_url, long_log),
        _spawn(
            database_url,
            short_log,
            "--incident-dedupe-s",
            "1",
            "--notify-dedupe-s",
            "1",
            "--source-docs",
            str(SHORT_SOURCE_DOCS),
        ),
    ]
    sims: list[Simulator] = []
    try:
        for proc, log in zip(procs, (long_log, short_log), strict=True):
            url = _first_line(proc, log)
            sims.append(Simulator(proc, url, httpx.Client(base_url=url, timeout=10.0), log))
        yield sims[0], sims[1]
    finally:
        for sim in sims:
            sim.client.close()
        codes = [_terminate(proc) for proc in procs]
    assert codes == [0, 0], "simulators must exit cleanly (code 0) on SIGTERM"


@pytest.fixture(scope="module")
def sim(simulators: tuple[Simulator, Simulator]) -> Simulator:
    return simulators[0]


@pytest.fixture(scope="module")
def sim_short(simulators: tuple[Simulator, Simulator]) -> Simulator:
    return simulators[1]


def post(sim: Simulator, path: str, body: Any, key: str | None = None, **headers: str):
    if key is not None:
        headers["Idempotency-Key"] = key
    return sim.client.post(path, json=body, headers=headers)


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def statuses(engine: Engine, **where: str) -> list[tuple[str, int, bool]]:
    column, value = next(iter(where.items()))
    sql = f"SELECT method, status, deduped FROM sim.requests WHERE {column} = :v ORDER BY id"
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql), {"v": value})]


def entity_rows(engine: Engine, key: str) -> int:
    tables = (
        "incidents",
        "incident_updates",
        "comments",
        "chat_replies",
        "notifications",
        "fine_tunes",
    )
    sql = " + ".join(f"(SELECT count(*) FROM sim.{t} WHERE idem_key = :k)" for t in tables)
    return int(scalar(engine, f"SELECT {sql}", k=key))


def test_healthz_and_ticket_read(sim: Simulator) -> None:
    assert sim.client.get("/healthz").json() == {"ok": True}
    first, second = sim.client.get("/tickets/T-42"), sim.client.get("/tickets/T-42")
    assert first.status_code == second.status_code == 200
    assert first.headers["content-type"] == "application/json"
    assert (
        first.json()
        == second.json()
        == {
            "id": "T-42",
            "title": "Ticket T-42",
            "status": "open",
            "priority": "p2",
        }
    )


def test_keyed_incident_create_twice_makes_one_incident(sim: Simulator, engine: Engine) -> None:
    key = new_key()
    first = post(sim, "/incidents", {"title": "disk full", "severity": "sev2"}, key)
    second = post(sim, "/incidents", {"title": "disk full", "severity": "sev2"}, key)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json() == second.json()
    assert first.json()["idem_key"] == key and first.json()["severity"] == "sev2"
    with engine.connect() as conn:
        assert incidents_by_key(conn)[key] == 1
        assert count_requests(conn, vendor="incidents", method="POST", idem_key=key) == 2
    assert statuses(engine, idem_key=key) == [("POST", 201, False), ("POST", 200, True)]
    assert [i["id"] for i in sim.client.get("/incidents", params={"key": key}).json()] == [
        first.json()["id"]
    ]


def test_unkeyed_incidents_always_create(sim: Simulator) -> None:
    first = post(sim, "/incidents", {"title": "no key"})
    second = post(sim, "/incidents", {"title": "no key"})
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]
    assert first.json()["severity"] == "sev3" and first.json()["idem_key"] is None


def test_short_window_creates_second_incident(
    sim: Simulator, sim_short: Simulator, engine: Engine
) -> None:
    key = new_key()
    sent = time.monotonic()
    first = post(sim_short, "/incidents", {"title": "flaky"}, key)
    assert first.status_code == 201
    again = post(sim_short, "/incidents", {"title": "flaky"}, key)
    if time.monotonic() - sent < 0.8:  # only judge the replay when surely inside the 1 s window
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    deadline = sent + 15.0
    while True:
        time.sleep(0.2)
        response = post(sim_short, "/incidents", {"title": "flaky"}, key)
        if response.status_code == 201:
            break
        assert response.status_code == 200
        assert time.monotonic() < deadline, "the 1 s dedupe window never expired"
    assert time.monotonic() - sent >= 0.9
    assert response.json()["id"] != first.json()["id"]
    with engine.connect() as conn:
        assert incidents_by_key(conn)[key] == 2
    # The default simulator's window is a day: the same key still replays there.
    assert post(sim, "/incidents", {"title": "flaky"}, key).status_code == 200
    with engine.connect() as conn:
        assert incidents_by_key(conn)[key] == 2


def test_concurrent_identical_keyed_creates_make_one_incident(
    sim: Simulator, engine: Engine
) -> None:
    workers = 10
    for _ in range(3):
        key = new_key()
        barrier = threading.Barrier(workers)

        def create(_: int, key: str = key, barrier: threading.Barrier = barrier) -> httpx.Response:
            barrier.wait(timeout=10)
            headers = {"Idempotency-Key": key}
            return httpx.post(
                sim.url + "/incidents", json={"title": "race"}, headers=headers, timeout=10
            )

        with ThreadPoolExecutor(workers) as pool:
            responses = list(pool.map(create, range(workers)))
        assert sorted(r.status_code for r in responses) == [200] * (workers - 1) + [201]
        assert len({r.json()["id"] for r in responses}) == 1
        with engine.connect() as conn:
            assert incidents_by_key(conn)[key] == 1
            assert count_requests(conn, idem_key=key) == workers
        dedupes = scalar(
            engine, "SELECT count(*) FROM sim.requests WHERE idem_key=:k AND deduped", k=key
        )
        assert dedupes == workers - 1


def test_incident_read_and_updates(sim: Simulator, engine: Engine) -> None:
    incident = post(sim, "/incidents", {"title": "latency"}, new_key()).json()
    key = new_key()
    path = f"/incidents/{incident['id']}/updates"
    first = post(sim, path, {"body": "mitigated"}, key)
    second = post(sim, path, {"body": "mitigated"}, key)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json() == second.json()
    read = sim.client.get(f"/incidents/{incident['id']}")
    assert read.status_code == 200
    assert [u["id"] for u in read.json()["updates"]] == [first.json()["id"]]
    assert sim.client.get("/incidents/987654321").status_code == 404
    assert sim.client.get("/incidents/not-a-number").status_code == 404
    missing = post(sim, "/incidents/987654321/updates", {"body": "x"}, new_key())
    assert missing.status_code == 404
    assert entity_rows(engine, key) == 1


def test_comments_are_not_deduped_and_are_findable_by_key(sim: Simulator, engine: Engine) -> None:
    key, issue = new_key(), "ISSUE-" + uuid.uuid4().hex[:8]
    first = post(sim, f"/issues/{issue}/comments", {"body": "looking"}, key)
    second = post(sim, f"/issues/{issue}/comments", {"body": "looking"}, key)
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]
    assert first.json()["idem_key"] == key and first.json()["issue"] == issue
    found = sim.client.get("/comments", params={"key": key})
    assert found.status_code == 200
    assert [c["id"] for c in found.json()] == [first.json()["id"], second.json()["id"]]
    listed = sim.client.get(f"/issues/{issue}/comments").json()
    assert [c["body"] for c in listed] == ["looking", "looking"]
    assert sim.client.get("/comments").status_code == 400
    with engine.connect() as conn:
        assert comments_by_key(conn)[key] == 2
        assert count_requests(conn, vendor="issues", method="POST", idem_key=key) == 2
    assert statuses(engine, idem_key=key) == [("POST", 201, False), ("POST", 201, False)]


def test_chat_replies(sim: Simulator, engine: Engine) -> None:
    key, conversation = new_key(), "conv-" + uuid.uuid4().hex[:8]
    cards = [{"type": "button", "label": "Ack"}]
    body = {"conversation": conversation, "text": "on it", "cards": cards}
    first = post(sim, "/chat/replies", body, key)
    second = post(sim, "/chat/replies", {"conversation": conversation, "text": "done"}, key)
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["cards"] == cards and second.json()["cards"] == []
    by_conv = sim.client.get("/chat/replies", params={"conversation": conversation}).json()
    assert [r["text"] for r in by_conv] == ["on it", "done"]
    by_key = sim.client.get("/chat/replies", params={"key": key}).json()
    assert len(by_key) == 2
    assert sim.client.get("/chat/replies").status_code == 400
    with engine.connect() as conn:
        assert chat_replies_by_key(conn)[key] == 2
        assert count_requests(conn, vendor="chat", idem_key=key) == 2


def test_every_request_is_recorded_once(sim: Simulator, engine: Engine) -> None:
    run = "run-" + uuid.uuid4().hex
    headers = {"X-Liyagent-Run": run, "X-Liyagent-Attempt": "3"}
    calls = [
        ("GET", "/healthz", None, 200),
        ("GET", "/tickets/T-1", None, 200),
        ("POST", "/incidents", {"title": "recorded"}, 201),
        ("GET", "/incidents?key=nothing", None, 200),
        ("POST", "/incidents", {"title": 7}, 400),
        ("GET", "/no/such/path", None, 404),
        ("DELETE", "/incidents", None, 405),
        ("BREW", "/tickets/T-1", None, 405),
        ("POST", "/issues/I-1/comments", {"body": "x"}, 201),
        ("POST", "/chat/replies", {"conversation": "c", "text": "t"}, 201),
        ("POST", "/notify", {"channel": "ops", "text": "t"}, 201),
        ("GET", "/notify?channel=ops", None, 200),
        ("POST", "/a2a", {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}}, 200),
        ("GET", "/a2a/.well-known/agent-card.json", None, 200),
        ("POST", "/fine_tunes", {"model": "m", "dataset": "d", "duration_s": 0}, 201),
        ("GET", "/fine_tunes/ft-none-such", None, 404),
        ("GET", "/source/docs?page=1&size=5", None, 200),
        ("GET", "/source/docs?size=0", None, 400),
        ("DELETE", "/source/docs", None, 405),
    ]
    for method, path, body, expected in calls:
        response = sim.client.request(method, path, json=body, headers=headers)
        assert response.status_code == expected, (method, path, response.text)
    recorded = statuses(engine, run_id=run)
    assert recorded == [(method, status, False) for method, _, _, status in calls]
    with engine.connect() as conn:
        assert count_requests(conn, run_id=run) == len(calls)
        assert count_requests(conn, vendor="incidents", run_id=run) == 4
        assert count_requests(conn, vendor="tickets", method="GET", run_id=run) == 1
        assert count_requests(conn, vendor="notify", run_id=run) == 2
        assert count_requests(conn, vendor="a2a", run_id=run) == 2
        assert count_requests(conn, vendor="finetune", run_id=run) == 2
        assert count_requests(conn, vendor="source", method="GET", run_id=run) == 2
    attempts = "SELECT count(*) FROM sim.requests WHERE run_id = :r AND attempt = 3"
    assert scalar(engine, attempts, r=run) == len(calls)


BAD_INPUTS = [
    ("/incidents", b"{not json", "JSON"),
    ("/incidents", b"[1, 2]", "object"),
    ("/incidents", b"{}", "title"),
    ("/incidents", b'{"title": ""}', "title"),
    ("/incidents", b'{"title": 5}', "title"),
    ("/incidents", b'{"title": "x", "severity": 5}', "severity"),
    ("/issues/I-9/comments", b'{"text": "wrong field"}', "body"),
    ("/chat/replies", b'{"text": "hi"}', "conversation"),
    ("/chat/replies", b'{"conversation": "c", "text": 1}', "text"),
    ("/chat/replies", b'{"conversation": "c", "text": "t", "cards": "no"}', "cards"),
    ("/notify", b"{not json", "JSON"),
    ("/notify", b'{"text": "hi"}', "channel"),
    ("/notify", b'{"channel": "ops"}', "text"),
    ("/notify", b'{"channel": "ops", "text": ["no"]}', "text"),
    ("/notify", b'{"channel": " ", "text": "t"}', "channel"),
    ("/fine_tunes", b"{not json", "JSON"),
    ("/fine_tunes", b'["m", "d"]', "object"),
    ("/fine_tunes", b'{"dataset": "d"}', "model"),
    ("/fine_tunes", b'{"model": "", "dataset": "d"}', "model"),
    ("/fine_tunes", b'{"model": "m"}', "dataset"),
    ("/fine_tunes", b'{"model": "m", "dataset": 3}', "dataset"),
    ("/fine_tunes", b'{"model": "m", "dataset": "d", "duration_s": "1"}', "duration_s"),
    ("/fine_tunes", b'{"model": "m", "dataset": "d", "duration_s": true}', "duration_s"),
    ("/fine_tunes", b'{"model": "m", "dataset": "d", "duration_s": -1}', "duration_s"),
    ("/fine_tunes", b'{"model": "m", "dataset": "d", "duration_s": 3600.5}', "duration_s"),
    ("/fine_tunes", b'{"model": "m", "dataset": "d", "duration_s": 1e400}', "range"),
]


@pytest.mark.parametrize(("path", "raw", "field"), BAD_INPUTS)
def test_bad_input_is_400_and_stores_nothing(
    sim: Simulator, engine: Engine, path: str, raw: bytes, field: str
) -> None:
    key = new_key()
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    response = sim.client.post(path, content=raw, headers=headers)
    assert response.status_code == 400
    assert field in response.json()["error"]
    assert entity_rows(engine, key) == 0
    assert statuses(engine, idem_key=key) == [("POST", 400, False)]


def test_unknown_path_and_wrong_method(sim: Simulator, engine: Engine) -> None:
    run = "run-" + uuid.uuid4().hex
    headers = {"X-Liyagent-Run": run}
    unknown = sim.client.get("/vendors/none", headers=headers)
    assert unknown.status_code == 404 and "error" in unknown.json()
    wrong = sim.client.put("/chat/replies", json={}, headers=headers)
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "GET, POST"
    assert statuses(engine, run_id=run) == [("GET", 404, False), ("PUT", 405, False)]


def test_delay_commits_the_effect_before_answering(sim: Simulator, engine: Engine) -> None:
    key, delay_s = new_key(), 4.0
    headers = {"Idempotency-Key": key, "X-Sim-Delay-Ms": str(int(delay_s * 1000))}
    sent = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(sim.url + "/incidents", json={"title": "slow"}, headers=headers, timeout=0.5)
    while entity_rows(engine, key) == 0:
        assert time.monotonic() - sent < delay_s - 0.5, "write not recorded before the answer"
        time.sleep(0.05)
    assert time.monotonic() - sent < delay_s  # seen while the vendor was still holding the answer
    assert statuses(engine, idem_key=key) == [("POST", 201, False)]
    retry = post(sim, "/incidents", {"title": "slow"}, key)
    assert retry.status_code == 200
    with engine.connect() as conn:
        assert incidents_by_key(conn)[key] == 1
    started = time.monotonic()
    short = post(sim, "/incidents", {"title": "slow"}, new_key(), **{"X-Sim-Delay-Ms": "300"})
    assert short.status_code == 201 and time.monotonic() - started >= 0.3


def test_injected_failure_stores_nothing(sim: Simulator, engine: Engine) -> None:
    key = new_key()
    fail = {"X-Sim-Fail": "500"}
    assert post(sim, "/incidents", {"title": "boom"}, key, **fail).status_code == 500
    assert post(sim, "/issues/I-1/comments", {"body": "b"}, key, **fail).status_code == 500
    assert (
        post(sim, "/chat/replies", {"conversation": "c", "text": "t"}, key, **fail).status_code
        == 500
    )
    assert post(sim, "/notify", {"channel": "c", "text": "t"}, key, **fail).status_code == 500
    assert entity_rows(engine, key) == 0
    assert statuses(engine, idem_key=key) == [("POST", 500, False)] * 4
    # Nothing happened, so the same key creates for real afterwards.
    assert post(sim, "/incidents", {"title": "boom"}, key).status_code == 201
    with engine.connect() as conn:
        assert incidents_by_key(conn)[key] == 1


def test_serve_in_process(database_url: str, engine: Engine) -> None:
    server, thread = serve("127.0.0.1", 0, database_url, incident_dedupe_s=60)
    try:
        key = new_key()
        with httpx.Client(base_url=server.url, timeout=10) as client:
            codes = [
                client.post("/incidents", json={"title": "t"}, headers={"Idempotency-Key": key})
                for _ in range(2)
            ]
        assert [c.status_code for c in codes] == [201, 200]
    finally:
        stop(server, thread)
    assert not thread.is_alive()
    with engine.connect() as conn:
        assert incidents_by_key(conn)[key] == 1


def test_serve_in_process_with_a_source_size(database_url: str) -> None:
    server, thread = serve("127.0.0.1", 0, database_url, source_docs=3)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            page = client.get("/source/docs", params={"size": 100}).json()
        assert page == {"docs": [source_doc(i) for i in range(3)], "next": None}
    finally:
        stop(server, thread)
    with pytest.raises(ValueError, match="source_docs"):
        serve("127.0.0.1", 0, database_url, source_docs=-1)


def test_serve_in_process_with_no_notify_window(database_url: str, engine: Engine) -> None:
    server, thread = serve("127.0.0.1", 0, database_url, notify_dedupe_s=0)
    try:
        key = new_key()
        with httpx.Client(base_url=server.url, timeout=10) as client:
            codes = [
                client.post(
                    "/notify", json={"channel": "c", "text": "t"}, headers={"Idempotency-Key": key}
                )
                for _ in range(2)
            ]
        assert [c.status_code for c in codes] == [201, 201]
    finally:
        stop(server, thread)
    with engine.connect() as conn:
        assert notifications_by_key(conn)[key] == 2


def test_notify_dedupes_within_the_window(sim: Simulator, engine: Engine) -> None:
    key, channel = new_key(), "chan-" + uuid.uuid4().hex[:8]
    first = post(sim, "/notify", {"channel": channel, "text": "deploy done"}, key)
    second = post(sim, "/notify", {"channel": channel, "text": "deploy done"}, key)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json() == second.json()
    assert first.json()["idem_key"] == key and first.json()["channel"] == channel
    assert first.json()["text"] == "deploy done"
    with engine.connect() as conn:
        assert notifications_by_key(conn)[key] == 1
        assert count_requests(conn, vendor="notify", method="POST", idem_key=key) == 2
    assert statuses(engine, idem_key=key) == [("POST", 201, False), ("POST", 200, True)]
    by_key = sim.client.get("/notify", params={"key": key})
    assert by_key.status_code == 200
    assert [n["id"] for n in by_key.json()] == [first.json()["id"]]
    unkeyed = post(sim, "/notify", {"channel": channel, "text": "no key"})
    assert unkeyed.status_code == 201 and unkeyed.json()["idem_key"] is None
    by_channel = sim.client.get("/notify", params={"channel": channel}).json()
    assert [n["text"] for n in by_channel] == ["deploy done", "no key"]
    assert sim.client.get("/notify").status_code == 400


def test_short_notify_window_creates_second_notification(
    sim: Simulator, sim_short: Simulator, engine: Engine
) -> None:
    key, body = new_key(), {"channel": "ops", "text": "flaky"}
    sent = time.monotonic()
    first = post(sim_short, "/notify", body, key)
    assert first.status_code == 201
    again = post(sim_short, "/notify", body, key)
    if time.monotonic() - sent < 0.8:  # only judge the replay when surely inside the 1 s window
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    deadline = sent + 15.0
    while True:
        time.sleep(0.2)
        response = post(sim_short, "/notify", body, key)
        if response.status_code == 201:
            break
        assert response.status_code == 200
        assert time.monotonic() < deadline, "the 1 s notify dedupe window never expired"
    assert time.monotonic() - sent >= 0.9
    assert response.json()["id"] != first.json()["id"]
    with engine.connect() as conn:
        assert notifications_by_key(conn)[key] == 2
    # The default simulator's window is 300 s: the same key still replays there.
    replay = post(sim, "/notify", body, key)
    assert replay.status_code == 200 and replay.json()["id"] == response.json()["id"]
    with engine.connect() as conn:
        assert notifications_by_key(conn)[key] == 2


def test_concurrent_identical_notifications_make_one(sim: Simulator, engine: Engine) -> None:
    workers = 10
    for _ in range(3):
        key = new_key()
        barrier = threading.Barrier(workers)

        def send(_: int, key: str = key, barrier: threading.Barrier = barrier) -> httpx.Response:
            barrier.wait(timeout=10)
            return httpx.post(
                sim.url + "/notify",
                json={"channel": "race", "text": "once"},
                headers={"Idempotency-Key": key},
                timeout=10,
            )

        with ThreadPoolExecutor(workers) as pool:
            responses = list(pool.map(send, range(workers)))
        assert sorted(r.status_code for r in responses) == [200] * (workers - 1) + [201]
        assert len({r.json()["id"] for r in responses}) == 1
        with engine.connect() as conn:
            assert notifications_by_key(conn)[key] == 1
            assert count_requests(conn, vendor="notify", idem_key=key) == workers
        dedupes = scalar(
            engine, "SELECT count(*) FROM sim.requests WHERE idem_key=:k AND deduped", k=key
        )
        assert dedupes == workers - 1


def rpc(sim: Simulator, method: str, params: Any, key: str | None = None) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return post(sim, "/a2a", body, key)


def a2a_message(message_id: str, text: str = "restart db", skill: str | None = None) -> Any:
    message: dict[str, Any] = {
        "messageId": message_id,
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    }
    if skill is not None:
        message["metadata"] = {"skill": skill}
    return {"message": message}


def test_a2a_task_completes_at_once_and_reads_back(sim: Simulator, engine: Engine) -> None:
    task_id = "task-" + uuid.uuid4().hex
    sent = rpc(sim, "SendMessage", a2a_message(task_id, skill="dba"))
    assert sent.status_code == 200
    task = sent.json()["result"]["task"]
    assert task["id"] == task_id and task["status"] == {"state": "TASK_STATE_COMPLETED"}
    assert task["artifacts"][0]["parts"] == [{"text": "dba handled: restart db"}]
    read = rpc(sim, "GetTask", {"id": task_id}).json()["result"]
    assert read == task
    anonymous = rpc(sim, "SendMessage", a2a_message("task-" + uuid.uuid4().hex, "hi"))
    answer = anonymous.json()["result"]["task"]["artifacts"][0]["parts"][0]["text"]
    assert answer == "remote-agent handled: hi"
    missing = rpc(sim, "GetTask", {"id": "none-" + uuid.uuid4().hex}).json()
    assert missing["error"]["code"] == -32001
    cancel = rpc(sim, "CancelTask", {"id": task_id}).json()
    assert cancel["error"]["code"] == -32002
    card = sim.client.get("/a2a/.well-known/agent-card.json").json()
    assert card["supportedInterfaces"][0]["url"] == f"{sim.url}/a2a"
    with engine.connect() as conn:
        assert a2a_tasks_by_id(conn)[task_id] == 1
        assert count_requests(conn, vendor="a2a", method="POST") >= 2


def test_a2a_repeated_message_makes_two_rows(sim: Simulator, engine: Engine) -> None:
    task_id, key = "task-" + uuid.uuid4().hex, new_key()
    first = rpc(sim, "SendMessage", a2a_message(task_id), key)
    second = rpc(sim, "SendMessage", a2a_message(task_id), key)
    assert first.json()["result"]["task"]["id"] == second.json()["result"]["task"]["id"]
    with engine.connect() as conn:
        assert a2a_tasks_by_id(conn)[task_id] == 2
        assert count_requests(conn, vendor="a2a", method="POST", idem_key=key) == 2
    assert statuses(engine, idem_key=key) == [("POST", 200, False), ("POST", 200, False)]


A2A_BAD_INPUTS = [
    (b"{not json", -32700),
    (b'"a string"', -32600),
    (b'{"jsonrpc": "2.0", "id": 1}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "Nope", "params": {}}', -32601),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": []}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": 5}}', -32602),
    (
        b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", '
        b'"params": {"message": {"messageId": "ID", "parts": []}}}',
        -32602,
    ),
    (
        b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": '
        b'{"messageId": "ID", "taskId": "t", "parts": [{"text": "x"}]}}}',
        -32004,
    ),
]


@pytest.mark.parametrize(("raw", "code"), A2A_BAD_INPUTS)
def test_a2a_bad_input_is_a_json_rpc_error_and_stores_nothing(
    sim: Simulator, engine: Engine, raw: bytes, code: int
) -> None:
    key, task_id = new_key(), "task-" + uuid.uuid4().hex
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    content = raw.replace(b'"ID"', f'"{task_id}"'.encode())
    before = scalar(engine, "SELECT count(*) FROM sim.a2a_tasks")
    response = sim.client.post("/a2a", content=content, headers=headers)
    assert response.status_code == 200
    assert response.json()["error"]["code"] == code
    assert scalar(engine, "SELECT count(*) FROM sim.a2a_tasks") == before
    with engine.connect() as conn:
        assert task_id not in a2a_tasks_by_id(conn)
    assert statuses(engine, idem_key=key) == [("POST", 200, False)]


def reply(text: str = "on it", **fields: Any) -> dict[str, Any]:
    card = {"contentType": "application/vnd.microsoft.card.adaptive", "content": {}}
    return {"type": "message", "text": text, "attachments": [card], **fields}


TOKEN_PATH = "/botframework.com/oauth2/v2.0/token"
SCOPE = "https://api.botframework.com/.default"


def register_bot(sim: Simulator, password: str = "s3cret", ttl_s: float = 3600) -> str:
    app_id = str(uuid.uuid4())
    digest = hashlib.sha256(password.encode()).hexdigest()
    body = {"app_id": app_id, "password_sha256": digest, "token_ttl_s": ttl_s}
    assert post(sim, "/sim/bots", body).status_code == 201
    return app_id


def ask_token(
    sim: Simulator, app_id: str, password: str = "s3cret", path: str = TOKEN_PATH, **form: str
):
    fields = {
        "grant_type": "client_credentials",
        "client_id": app_id,
        "client_secret": password,
        "scope": SCOPE,
        **form,
    }
    return sim.client.post(path, data=fields)


def bearer(sim: Simulator, app_id: str) -> dict[str, str]:
    answer = ask_token(sim, app_id)
    assert answer.status_code == 200, answer.text
    return {"Authorization": f"Bearer {answer.json()['access_token']}"}


def test_token_endpoint_issues_expiring_tokens_to_registered_bots(
    sim: Simulator, engine: Engine
) -> None:
    app_id = register_bot(sim)
    answer = ask_token(sim, app_id)
    assert answer.status_code == 200
    grant = answer.json()
    assert grant["token_type"] == "Bearer" and grant["expires_in"] == 3600
    assert grant["access_token"] != ask_token(sim, app_id).json()["access_token"]
    refusals = {
        "wrong password": (ask_token(sim, app_id, "nope"), 401, "invalid_client"),
        "unknown bot": (ask_token(sim, str(uuid.uuid4())), 401, "invalid_client"),
        "wrong scope": (ask_token(sim, app_id, scope="https://x/.default"), 400, "invalid_scope"),
        "wrong grant": (
            ask_token(sim, app_id, grant_type="password"),
            400,
            "unsupported_grant_type",
        ),
        "JSON body": (sim.client.post(TOKEN_PATH, json={}), 400, "invalid_request"),
        "Graph scope from the connector's tenant": (
            ask_token(sim, app_id, scope="https://graph.microsoft.com/.default"),
            400,
            "invalid_scope",
        ),
        "connector scope from a tenant": (
            ask_token(sim, app_id, path="/login.microsoftonline.com/t-1/oauth2/v2.0/token"),
            400,
            "invalid_scope",
        ),
    }
    for why, (refused, status, code) in refusals.items():
        assert (refused.status_code, refused.json()["error"]) == (status, code), why
    # The records keep the form without its secret.
    with engine.connect() as conn:
        bodies = conn.execute(
            text(
                "SELECT body FROM sim.requests WHERE vendor = 'login' AND body->>'client_id' = :a"
            ),
            {"a": app_id},
        ).scalars()
        kept = list(bodies)
    assert kept and all(b["client_secret"] == "(masked)" for b in kept)
    assert "s3cret" not in repr(kept)
    short = register_bot(sim, ttl_s=1)
    assert ask_token(sim, short).json()["expires_in"] == 1


def test_connector_requires_a_valid_bot_token(sim: Simulator, engine: Engine) -> None:
    path = f"/v3/conversations/{quote('a:1y', safe='')}/activities"
    app_id = register_bot(sim)
    auth = bearer(sim, app_id)
    for headers in ({}, {"Authorization": "Bearer made-up"}, {"Authorization": "Basic x"}):
        refused = sim.client.post(f"{path}/act-1", json=reply(), headers=headers)
        assert refused.status_code == 401, headers
        assert refused.headers["www-authenticate"].startswith("Bearer")
    # A token the bot got for Microsoft Graph is not one for the connector.
    graph = graph_bearer(sim, app_id)
    assert sim.client.post(f"{path}/act-1", json=reply(), headers=graph).status_code == 401
    assert sim.client.post(f"{path}/act-1", json=reply(), headers=auth).status_code == 201
    revoked = sim.client.post(f"/sim/bots/{app_id}/revoke")
    assert revoked.json() == {"expired": 2}  # its connector token and its Graph token
    assert sim.client.post(f"{path}/act-1", json=reply(), headers=auth).status_code == 401
    assert (
        scalar(engine, "SELECT count(*) FROM sim.connector_activities WHERE app_id = :a", a=app_id)
        == 1
    )
    # A token's lifetime ends by the database clock.
    short = register_bot(sim, ttl_s=1)
    auth = bearer(sim, short)
    deadline = time.monotonic() + 10
    while scalar(
        engine,
        "SELECT count(*) FROM sim.bot_tokens WHERE app_id = :a AND expires_at > clock_timestamp()",
        a=short,
    ):
        assert time.monotonic() < deadline, "the 1 s token never expired"
        time.sleep(0.1)
    assert sim.client.post(f"{path}/act-1", json=reply(), headers=auth).status_code == 401


def test_connector_replies_are_kept_and_never_listed(sim: Simulator, engine: Engine) -> None:
    conversation, key = "a:1x", new_key()
    path = f"/v3/conversations/{quote(conversation, safe='')}/activities"
    app_id = register_bot(sim)
    auth = bearer(sim, app_id)
    first = post(sim, f"{path}/act-1", reply(), key, **auth)
    second = post(sim, f"{path}/act-1", reply("again"), key, **auth)
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]
    sent = post(sim, path, reply("to all", replyToId="act-2"), **auth)
    assert sent.status_code == 201
    # The Bot Connector has no way to list a conversation's activities, by key or otherwise:
    # it answers as Microsoft's does, and nothing it kept is read back here.
    for params in ({"key": key}, {}):
        refused = sim.client.get(path, params=params, headers=auth)
        assert refused.status_code == 405, params
        assert refused.headers["allow"] == "POST"
        assert refused.json() == {
            "message": "The requested resource does not support http method 'GET'."
        }
        assert key not in refused.text
    for bad in ({"type": "typing"}, {"type": "message"}, reply(text=5), reply(attachments=[{}])):
        assert post(sim, f"{path}/act-3", bad, **auth).status_code == 400, bad
    with engine.connect() as conn:
        assert connector_posts_by_key(conn)[key] == 2
        assert count_requests(conn, vendor="connector", idem_key=key) == 2
        kept = conn.execute(
            text("SELECT DISTINCT app_id FROM sim.connector_activities WHERE idem_key = :k"),
            {"k": key},
        ).scalars()
        assert list(kept) == [app_id]


GRAPH_SCOPE = "https://graph.microsoft.com/.default"
TENANT = str(uuid.uuid4())


def graph_bearer(sim: Simulator, app_id: str, tenant: str = TENANT) -> dict[str, str]:
    path = f"/login.microsoftonline.com/{tenant}/oauth2/v2.0/token"
    answer = ask_token(sim, app_id, scope=GRAPH_SCOPE, path=path)
    assert answer.status_code == 200, answer.text
    return {"Authorization": f"Bearer {answer.json()['access_token']}"}


def card_reply(text: str, key: str, user: str) -> dict[str, Any]:
    card = {
        "contentType": "application/vnd.microsoft.card.adaptive",
        "content": {
            "type": "AdaptiveCard",
            "body": [{"type": "TextBlock", "id": key, "text": text}],
        },
    }
    return {
        "type": "message",
        "text": text,
        "attachments": [card],
        "recipient": {"id": "29:x", "aadObjectId": user},
        "channelData": {"secret": key},
    }


def install_personal(
    sim: Simulator, app_id: str, user: str, manifest: str | None = None, **more: str
) -> tuple[str, str]:
    """The bot's app installed for `user` (in TENANT), as Teams does when they add it; the
    personal conversation (a Bot Framework id) and the app's manifest id."""
    conversation, manifest = "a:1" + uuid.uuid4().hex, manifest or str(uuid.uuid4())
    body = {
        "user_id": user,
        "app_id": app_id,
        "manifest_id": manifest,
        "conversation_id": conversation,
        "tenant_id": TENANT,
        **more,
    }
    assert post(sim, "/sim/teams/personal", body).status_code == 201
    return conversation, manifest


def personal_chat(sim: Simulator, graph: dict[str, str], user: str, manifest: str) -> str:
    """The Graph id of the bot's chat with `user`, through Graph's documented calls."""
    apps = f"/v1.0/users/{user}/teamwork/installedApps"
    found = sim.client.get(
        apps,
        params={"$expand": "teamsApp", "$filter": f"teamsApp/externalId eq '{manifest}'"},
        headers=graph,
    )
    assert found.status_code == 200, found.text
    [installation] = found.json()["value"]
    chat = sim.client.get(f"{apps}/{quote(installation['id'], safe='')}/chat", headers=graph)
    assert chat.status_code == 200, chat.text
    return str(chat.json()["id"])


def test_graph_shows_a_bots_replies_with_their_cards_and_nothing_else(
    sim: Simulator, engine: Engine
) -> None:
    app_id, other = register_bot(sim), register_bot(sim)
    user, key = str(uuid.uuid4()), new_key()
    auth, graph = bearer(sim, app_id), graph_bearer(sim, app_id)
    conversation, manifest = install_personal(sim, app_id, user)
    convo = f"/v3/conversations/{quote(conversation, safe='')}/activities"
    posted = [
        post(sim, f"{convo}/act-{i}", card_reply(f"r{i}", key, user), key, **auth) for i in range(3)
    ]
    assert [p.status_code for p in posted] == [201, 201, 201]
    chat = personal_chat(sim, graph, user, manifest)
    messages = f"/v1.0/chats/{quote(chat, safe='')}/messages"
    page = sim.client.get(messages, headers=graph)
    assert page.status_code == 200, page.text
    found = page.json()["value"]
    # Newest first; the ids are the ones the connector answered the posts with.
    assert [m["id"] for m in found] == [p.json()["id"] for p in reversed(posted)]
    newest = found[0]
    assert newest["from"]["application"]["id"] == app_id and newest["from"]["user"] is None
    [attachment] = newest["attachments"]
    assert isinstance(attachment["content"], str)  # Graph gives the card as a JSON string
    assert json.loads(attachment["content"])["body"][0] == {
        "type": "TextBlock",
        "id": key,
        "text": "r2",
    }
    assert "channelData" not in newest and "secret" not in page.text
    # Paging: $top and the next link, which carries the query on.
    first = sim.client.get(messages, params={"$top": "2"}, headers=graph).json()
    assert len(first["value"]) == 2 and first["@odata.nextLink"].startswith(sim.url)
    rest = sim.client.get(first["@odata.nextLink"], headers=graph).json()
    assert [m["id"] for m in rest["value"]] == [posted[0].json()["id"]]
    assert "@odata.nextLink" not in rest
    # $filter works from below on lastModifiedDateTime only, with its $orderby; without it
    # Graph ignores the filter.
    later = "2999-01-01T00:00:00.000Z"
    filtered = {
        "$orderby": "lastModifiedDateTime desc",
        "$filter": f"lastModifiedDateTime gt {later}",
    }
    assert sim.client.get(messages, params=filtered, headers=graph).json()["value"] == []
    ignored = {"$filter": f"lastModifiedDateTime gt {later}"}
    assert len(sim.client.get(messages, params=ignored, headers=graph).json()["value"]) == 3
    refusals = {
        "a connector token": (sim.client.get(messages, headers=auth), 401),
        "no token": (sim.client.get(messages), 401),
        "page too big": (sim.client.get(messages, params={"$top": "51"}, headers=graph), 400),
        "ascending": (
            sim.client.get(messages, params={"$orderby": "createdDateTime asc"}, headers=graph),
            400,
        ),
        "created after": (
            sim.client.get(
                messages,
                params={
                    "$orderby": "createdDateTime desc",
                    "$filter": f"createdDateTime gt {later}",
                },
                headers=graph,
            ),
            400,
        ),
        "an option Graph lacks here": (
            sim.client.get(messages, params={"$search": key}, headers=graph),
            400,
        ),
        "another app's chat": (sim.client.get(messages, headers=graph_bearer(sim, other)), 403),
        "not a chat id": (sim.client.get("/v1.0/chats/a%3A1x/messages", headers=graph), 404),
        "the chat a formula would name": (
            sim.client.get(
                f"/v1.0/chats/{quote(f'19:{user}_{app_id}@unq.gbl.spaces', safe='')}/messages",
                headers=graph,
            ),
            404,
        ),
        "no list of activities": (sim.client.get(convo, headers=auth), 405),
    }
    for why, (answer, status) in refusals.items():
        assert answer.status_code == status, (why, answer.text)
    # A group chat is itself; a channel thread is its root message's replies, under its team.
    group, channel, team = (
        f"19:{uuid.uuid4().hex}@thread.v2",
        f"19:{uuid.uuid4().hex}@thread.tacv2",
        str(uuid.uuid4()),
    )
    assert (
        post(sim, "/sim/graph/channels", {"team_id": team, "channel_id": channel}).status_code
        == 201
    )
    for conversation in (group, f"{channel};messageid=1700"):
        path = f"/v3/conversations/{quote(conversation, safe='')}/activities/act-9"
        assert post(sim, path, card_reply("hi", key, user), **auth).status_code == 201
    in_group = sim.client.get(f"/v1.0/chats/{quote(group, safe='')}/messages", headers=graph)
    assert [m["chatId"] for m in in_group.json()["value"]] == [group]
    replies = f"/v1.0/teams/{team}/channels/{quote(channel, safe='')}/messages/1700/replies"
    [in_thread] = sim.client.get(replies, headers=graph).json()["value"]
    assert in_thread["replyToId"] == "1700"
    assert in_thread["channelIdentity"] == {"teamId": team, "channelId": channel}
    elsewhere = replies.replace(team, str(uuid.uuid4()))
    assert sim.client.get(elsewhere, headers=graph).status_code == 404
    # A team is named by its group id: its thread id (what activities carry) is refused.
    by_thread = replies.replace(team, quote(channel, safe=""))
    refused = sim.client.get(by_thread, headers=graph)
    assert refused.status_code == 400 and "valid GUID" in refused.text
    assert (
        sim.client.get(
            replies, params={"$orderby": "createdDateTime desc"}, headers=graph
        ).status_code
        == 400
    )
    with engine.connect() as conn:
        assert count_requests(conn, vendor="graph") >= 10


def test_graph_shows_a_post_only_after_its_lag(sim: Simulator) -> None:
    app_id, user = register_bot(sim), str(uuid.uuid4())
    auth, graph = bearer(sim, app_id), graph_bearer(sim, app_id)
    conversation, manifest = install_personal(sim, app_id, user)
    chat = quote(personal_chat(sim, graph, user, manifest), safe="")
    convo = f"/v3/conversations/{quote(conversation, safe='')}/activities/act-1"
    assert post(sim, "/sim/graph", {"lag_ms": 1500}).status_code == 200
    try:
        sent = time.monotonic()
        assert post(sim, convo, card_reply("late", new_key(), user), **auth).status_code == 201
    finally:
        assert post(sim, "/sim/graph", {"lag_ms": 0}).status_code == 200
    assert sim.client.get(f"/v1.0/chats/{chat}/messages", headers=graph).json()["value"] == []
    while not sim.client.get(f"/v1.0/chats/{chat}/messages", headers=graph).json()["value"]:
        assert time.monotonic() - sent < 10, "the post never showed"
        time.sleep(0.1)
    assert time.monotonic() - sent >= 1.4


def test_a_personal_chat_id_is_made_by_teams_and_told_only_by_graph(
    sim: Simulator, engine: Engine
) -> None:
    """Installing the app for a person makes their chat with it, under an id of Teams's own;
    Graph tells it through the installation (found by the app's manifest id, or a store app's
    catalog id), in the token's tenant only, and a post to the personal conversation shows
    there."""
    app_id, user = register_bot(sim), str(uuid.uuid4())
    graph = graph_bearer(sim, app_id)
    _, manifest = install_personal(sim, app_id, user)
    apps = f"/v1.0/users/{user}/teamwork/installedApps"
    listed = sim.client.get(apps, params={"$expand": "teamsApp,teamsAppDefinition"}, headers=graph)
    [installation] = listed.json()["value"]
    app = installation["teamsApp"]
    assert app["externalId"] == manifest and app["id"] not in (manifest, app_id)
    assert installation["teamsAppDefinition"]["teamsAppId"] == app["id"]
    by_id = {"$expand": "teamsApp", "$filter": f"teamsApp/id eq '{app['id']}'"}
    assert sim.client.get(apps, params=by_id, headers=graph).json()["value"] == [
        {"id": installation["id"], "teamsApp": app}
    ]
    none = {"$filter": f"teamsApp/externalId eq '{app_id}'"}  # the bot's id is not the app's
    assert sim.client.get(apps, params=none, headers=graph).json()["value"] == []
    chat = personal_chat(sim, graph, user, manifest)
    assert chat.endswith("@unq.gbl.spaces") and user not in chat and app_id not in chat
    answered = sim.client.get(f"{apps}/{quote(installation['id'], safe='')}/chat", headers=graph)
    assert answered.json()["chatType"] == "oneOnOne" and answered.json()["tenantId"] == TENANT
    # Installing again (another conversation id of the same chat) keeps the one chat.
    again, _ = install_personal(sim, app_id, user, manifest)
    assert personal_chat(sim, graph, user, manifest) == chat
    auth = bearer(sim, app_id)
    path = f"/v3/conversations/{quote(again, safe='')}/activities/act-1"
    assert post(sim, path, card_reply("hi", new_key(), user), **auth).status_code == 201
    shown = sim.client.get(f"/v1.0/chats/{quote(chat, safe='')}/messages", headers=graph)
    assert [m["chatId"] for m in shown.json()["value"]] == [chat]
    # A store app: its catalog id is its manifest id, and it has no externalId.
    store_user = str(uuid.uuid4())
    _, store_manifest = install_personal(sim, app_id, store_user, distribution_method="store")
    store_apps = f"/v1.0/users/{store_user}/teamwork/installedApps"
    by_manifest = {"$expand": "teamsApp", "$filter": f"teamsApp/id eq '{store_manifest}'"}
    [store_install] = sim.client.get(store_apps, params=by_manifest, headers=graph).json()["value"]
    assert store_install["teamsApp"]["externalId"] is None
    refusals = {
        "a connector token": (sim.client.get(apps, headers=auth), 401),
        "a filter Graph lacks": (
            sim.client.get(apps, params={"$filter": "teamsApp/displayName eq 'x'"}, headers=graph),
            400,
        ),
        "an option Graph lacks here": (
            sim.client.get(apps, params={"$top": "1"}, headers=graph),
            400,
        ),
        "someone else's installation": (
            sim.client.get(
                f"/v1.0/users/{store_user}/teamwork/installedApps/"
                f"{quote(installation['id'], safe='')}/chat",
                headers=graph,
            ),
            404,
        ),
    }
    for why, (answer, status) in refusals.items():
        assert answer.status_code == status, (why, answer.text)
    # Installations are the token's tenant's: another tenant's token sees none.
    other_tenant = graph_bearer(sim, app_id, tenant=str(uuid.uuid4()))
    assert sim.client.get(apps, headers=other_tenant).json()["value"] == []
    with engine.connect() as conn:
        assert count_requests(conn, vendor="graph") >= 8


def test_the_connector_tells_a_team_s_group_id_to_a_bot_installed_in_it(sim: Simulator) -> None:
    app_id, other = register_bot(sim), register_bot(sim)
    team, group = f"19:{uuid.uuid4().hex}@thread.tacv2", str(uuid.uuid4())
    body = {"team_id": team, "aad_group_id": group, "name": "Support", "app_id": app_id}
    assert post(sim, "/sim/teams", body).status_code == 201
    path = f"/v3/teams/{quote(team, safe='')}"
    details = sim.client.get(path, headers=bearer(sim, app_id))
    assert details.status_code == 200
    assert details.json() == {"id": team, "name": "Support", "aadGroupId": group}
    refusals = {
        "no token": (sim.client.get(path), 401),
        "a Graph token": (sim.client.get(path, headers=graph_bearer(sim, app_id)), 401),
        "a bot not in the team": (sim.client.get(path, headers=bearer(sim, other)), 403),
        "a team it does not know": (
            sim.client.get(
                f"/v3/teams/{quote(f'19:{uuid.uuid4().hex}@thread.tacv2', safe='')}",
                headers=bearer(sim, app_id),
            ),
            404,
        ),
    }
    for why, (answer, status) in refusals.items():
        assert answer.status_code == status, (why, answer.text)


def fine_tune(sim: Simulator, key: str | None = None, **body: Any) -> httpx.Response:
    return post(sim, "/fine_tunes", {"model": "base-7b", "dataset": "tickets-v1", **body}, key)


def test_fine_tune_create_runs_then_succeeds(sim: Simulator, engine: Engine) -> None:
    key = new_key()
    created = fine_tune(sim, key, duration_s=1)
    assert created.status_code == 201
    job = created.json()
    assert set(job) == {"id", "model", "dataset", "status", "created_at"}
    assert re.fullmatch(r"ft-[0-9a-f]{12}", job["id"])
    assert (job["model"], job["dataset"], job["status"]) == ("base-7b", "tickets-v1", "running")
    sent = time.monotonic()
    read = sim.client.get(f"/fine_tunes/{job['id']}")
    assert read.status_code == 200
    if time.monotonic() - sent < 0.5:  # only judge "running" when surely inside the 1 s duration
        assert read.json() == {
            "id": job["id"],
            "model": "base-7b",
            "status": "running",
            "fine_tuned_model": None,
        }
    deadline = sent + 15.0
    while read.json()["status"] == "running":
        assert time.monotonic() < deadline, "the 1 s fine-tune never finished"
        time.sleep(0.2)
        read = sim.client.get(f"/fine_tunes/{job['id']}")
        assert read.status_code == 200
    assert read.json() == {
        "id": job["id"],
        "model": "base-7b",
        "status": "succeeded",
        "fine_tuned_model": f"base-7b:ft-{job['id']}",
    }
    with engine.connect() as conn:
        assert fine_tunes_by_key(conn)[key] == 1
        assert count_requests(conn, vendor="finetune", method="POST", idem_key=key) == 1
    stored = scalar(engine, "SELECT duration_s FROM sim.fine_tunes WHERE id = :i", i=job["id"])
    assert stored == 1.0
    default = fine_tune(sim).json()
    assert default["status"] == "running"
    assert scalar(
        engine, "SELECT duration_s FROM sim.fine_tunes WHERE id = :i", i=default["id"]
    ) == pytest.approx(2.0)
    instant = fine_tune(sim, duration_s=0).json()
    assert instant["status"] == "succeeded"
    assert sim.client.get(f"/fine_tunes/{instant['id']}").json()["fine_tuned_model"] == (
        f"base-7b:ft-{instant['id']}"
    )


def test_fine_tune_dedupes_on_key(sim: Simulator, engine: Engine) -> None:
    key = new_key()
    first = fine_tune(sim, key, duration_s=600)
    second = fine_tune(sim, key, duration_s=600)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json() == second.json()
    other = fine_tune(sim, new_key(), duration_s=600)
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    with engine.connect() as conn:
        assert fine_tunes_by_key(conn)[key] == 1
        assert count_requests(conn, vendor="finetune", method="POST", idem_key=key) == 2
    assert statuses(engine, idem_key=key) == [("POST", 201, False), ("POST", 200, True)]
    unkeyed = [fine_tune(sim).json()["id"] for _ in range(2)]
    assert unkeyed[0] != unkeyed[1]


def test_fine_tune_dedupe_uses_the_incident_window(
    sim: Simulator, sim_short: Simulator, engine: Engine
) -> None:
    key = new_key()
    first = fine_tune(sim_short, key)
    assert first.status_code == 201
    time.sleep(1.2)
    second = fine_tune(sim_short, key)
    assert second.status_code == 201 and second.json()["id"] != first.json()["id"]
    replay = fine_tune(sim, key)  # the default window is a day
    assert replay.status_code == 200 and replay.json()["id"] == second.json()["id"]
    with engine.connect() as conn:
        assert fine_tunes_by_key(conn)[key] == 2


def test_concurrent_identical_fine_tunes_make_one(sim: Simulator, engine: Engine) -> None:
    workers, key = 10, new_key()
    barrier = threading.Barrier(workers)

    def create(_: int) -> httpx.Response:
        barrier.wait(timeout=10)
        return httpx.post(
            sim.url + "/fine_tunes",
            json={"model": "m", "dataset": "d"},
            headers={"Idempotency-Key": key},
            timeout=10,
        )

    with ThreadPoolExecutor(workers) as pool:
        responses = list(pool.map(create, range(workers)))
    assert sorted(r.status_code for r in responses) == [200] * (workers - 1) + [201]
    assert len({r.json()["id"] for r in responses}) == 1
    with engine.connect() as conn:
        assert fine_tunes_by_key(conn)[key] == 1
        assert count_requests(conn, vendor="finetune", idem_key=key) == workers
    dedupes = scalar(
        engine, "SELECT count(*) FROM sim.requests WHERE idem_key=:k AND deduped", k=key
    )
    assert dedupes == workers - 1


def test_fine_tune_unknown_is_404(sim: Simulator, engine: Engine) -> None:
    run = "run-" + uuid.uuid4().hex
    missing = sim.client.get("/fine_tunes/ft-000000000000", headers={"X-Liyagent-Run": run})
    assert missing.status_code == 404 and "error" in missing.json()
    wrong = sim.client.put("/fine_tunes", json={}, headers={"X-Liyagent-Run": run})
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert statuses(engine, run_id=run) == [("GET", 404, False), ("PUT", 405, False)]
    with engine.connect() as conn:
        assert count_requests(conn, vendor="finetune", run_id=run) == 2


def _whole_corpus(sim: Simulator, size: int) -> tuple[list[dict[str, Any]], int]:
    """Every document of the source, page by page; also how many pages it took."""
    docs: list[dict[str, Any]] = []
    page: int | None = 0
    pages = 0
    while page is not None:
        response = sim.client.get("/source/docs", params={"page": page, "size": size})
        assert response.status_code == 200
        body = response.json()
        assert set(body) == {"docs", "next"}
        assert len(body["docs"]) <= size
        assert body["next"] in (None, page + 1)
        docs.extend(body["docs"])
        pages += 1
        assert pages <= 1000, "the source never reached its last page"
        page = body["next"]
    return docs, pages


@pytest.mark.parametrize("size", [1, 3, 10, 25, 100])
def test_source_pages_cover_the_corpus_once(sim: Simulator, size: int) -> None:
    docs, pages = _whole_corpus(sim, size)
    assert len(docs) == 25
    assert pages == -(-25 // size)
    assert len({d["id"] for d in docs}) == 25
    assert docs == [source_doc(i) for i in range(25)]
    assert docs[7] == {"id": "doc-0007", "title": "Document 7", "content": docs[7]["content"]}
    assert all(d["content"] for d in docs) and len({d["content"] for d in docs}) == 25


def test_source_corpus_is_deterministic_and_sized_by_flag(
    sim: Simulator, sim_short: Simulator, engine: Engine
) -> None:
    run = "run-" + uuid.uuid4().hex
    default = sim.client.get("/source/docs", headers={"X-Liyagent-Run": run}).json()
    assert [d["id"] for d in default["docs"]] == [f"doc-{i:04d}" for i in range(10)]
    assert default["next"] == 1
    assert sim_short.client.get("/source/docs").json()["docs"] == default["docs"][:7]
    short, pages = _whole_corpus(sim_short, 3)
    assert [d["id"] for d in short] == [f"doc-{i:04d}" for i in range(SHORT_SOURCE_DOCS)]
    assert pages == 3
    last = sim_short.client.get("/source/docs", params={"page": 2, "size": 3}).json()
    assert last == {"docs": [source_doc(6)], "next": None}
    exact = sim.client.get("/source/docs", params={"page": 4, "size": 5}).json()
    assert [d["id"] for d in exact["docs"]] == [f"doc-{i:04d}" for i in range(20, 25)]
    assert exact["next"] is None
    beyond = sim.client.get("/source/docs", params={"page": 9, "size": 10}).json()
    assert beyond == {"docs": [], "next": None}
    assert statuses(engine, run_id=run) == [("GET", 200, False)]
    with engine.connect() as conn:
        assert count_requests(conn, vendor="source", method="GET", run_id=run) == 1


SOURCE_BAD_PARAMS = [
    ({"page": "-1"}, "page"),
    ({"page": "x"}, "page"),
    ({"page": ""}, "page"),
    ({"page": "1.5"}, "page"),
    ({"page": "9" * 40}, "page"),
    ({"size": "0"}, "size"),
    ({"size": "101"}, "size"),
    ({"size": "-3"}, "size"),
    ({"size": "ten"}, "size"),
    ({"page": "0", "size": ""}, "size"),
]


@pytest.mark.parametrize(("params", "field"), SOURCE_BAD_PARAMS)
def test_source_bad_params_are_400(
    sim: Simulator, engine: Engine, params: dict[str, str], field: str
) -> None:
    run = "run-" + uuid.uuid4().hex
    response = sim.client.get("/source/docs", params=params, headers={"X-Liyagent-Run": run})
    assert response.status_code == 400
    assert field in response.json()["error"]
    assert statuses(engine, run_id=run) == [("GET", 400, False)]
