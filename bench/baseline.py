"""The plain-Celery baseline: the same agent without durability, to measure liyagent against.

A small Celery app of its own (`celery -A bench.baseline worker`): acks_late, prefetch 1,
results ignored, every other setting Celery's default. Its one task plays an agent loop the
way a hand-written Celery task would: ask the model (the simulators' scripted,
OpenAI-compatible model over HTTP, sent the same tool schemas liyagent sends), make each tool
call the model asks for against the same vendor simulators over HTTP (the same requests the
built-in vendor tools make, with an idempotency key), and at the end INSERT the answer into
Postgres, once, in autocommit. Every request goes through liyagent's own pooled HTTP client
(runtime/sending/http.py `shared_client()`), so the two sides differ only by what liyagent adds:
checkpoints, marks, outcomes, leases and their round trips.

Configured from the environment (the bench sets it): BENCH_BASELINE_BROKER (Redis URL),
BENCH_BASELINE_NAMESPACE (key prefix), BENCH_BASELINE_QUEUE, BENCH_BASELINE_DATABASE_URL,
BENCH_VENDOR_URL (the simulators, their model included), and the simulators' model key
(SIM_MODEL_API_KEY).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import sqlalchemy as sa
from celery import Celery

from liyagent import vendor_tools
from liyagent.local import sim_model
from runtime.models.openai import to_chat_tools, wire_name
from runtime.sending import http

TASK = "bench.baseline.agent"
STEP_LIMIT = 25
TIMEOUT_S = 30.0
# The vendor tools the bench's agents use, as the built-in module declares them.
TOOLS = {
    t.name: t
    for t in (vendor_tools.ticket_read, vendor_tools.incident_create, vendor_tools.issue_comment)
}
ANSWERS_DDL = (
    "CREATE TABLE IF NOT EXISTS answers (job_id uuid PRIMARY KEY, answer text NOT NULL, "
    "finished_at timestamptz NOT NULL DEFAULT now())"
)


def config(broker: str, namespace: str, queue: str) -> dict[str, Any]:
    """Celery's defaults plus what the comparison needs: late acks, one message per child."""
    return {
        "broker_url": broker,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"global_keyprefix": namespace},
        "task_default_queue": queue,
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
    }


def make_app(broker: str, namespace: str, queue: str) -> Celery:
    """The baseline's Celery app (the worker's, or a client's that sends its tasks)."""
    app = Celery("liyagent-bench-baseline", set_as_current=False)
    app.conf.update(config(broker, namespace, queue))
    app.task(name=TASK, bind=False)(agent)
    return app


_engines: dict[int, sa.Engine] = {}
_lock = threading.Lock()


def _engine() -> sa.Engine:
    """This process's engine (a forked pool child makes its own): autocommit, SQLAlchemy's
    default pool."""
    with _lock:
        pid = os.getpid()
        if pid not in _engines:
            url = os.environ["BENCH_BASELINE_DATABASE_URL"]
            _engines[pid] = sa.create_engine(
                url, isolation_level="AUTOCOMMIT", hide_parameters=True
            )
        return _engines[pid]


def _vendor(path: str) -> str:
    return os.environ["BENCH_VENDOR_URL"].rstrip("/") + path


def call_tool(name: str, args: dict[str, Any], headers: dict[str, str]) -> Any:
    """One tool call, as the built-in vendor tool makes it: one HTTP request."""
    client = http.shared_client()
    if name == "ticket.read":
        response = client.get(
            _vendor(f"/tickets/{args['ticket']}"), headers=headers, timeout=TIMEOUT_S
        )
    elif name == "incident.create":
        body = {"title": args["title"], "severity": args.get("severity", "sev3")}
        response = client.post(_vendor("/incidents"), json=body, headers=headers, timeout=TIMEOUT_S)
    elif name == "issue.comment":
        path = f"/issues/{args['issue']}/comments"
        response = client.post(
            _vendor(path), json={"body": args["body"]}, headers=headers, timeout=TIMEOUT_S
        )
    else:
        raise ValueError(f"the baseline has no tool {name!r}")
    response.raise_for_status()
    return response.json()


def _ask(
    model: dict[str, str], messages: list[dict[str, Any]], tools: list[str], headers: dict[str, str]
) -> dict[str, Any]:
    """One chat-completions request to the scripted model; the assistant message."""
    schemas = to_chat_tools([TOOLS[t].to_tool("bench").schema() for t in tools])
    body = {"model": model["model"], "messages": messages, "tools": schemas}
    key = os.environ.get(sim_model.KEY_ENV, sim_model.KEY)
    response = http.shared_client().post(
        _vendor("/v1/chat/completions"),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", **headers},
        content=json.dumps(body),
        timeout=TIMEOUT_S,
    )
    response.raise_for_status()
    return dict(response.json()["choices"][0]["message"])


def agent(job_id: str, model: dict[str, str], tools: list[str], user_input: str) -> None:
    """The agent loop: model, tool calls, model ... until a final answer; then one INSERT."""
    ident = {"X-Liyagent-Run": job_id, "X-Liyagent-Attempt": "1"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": user_input}]
    answer = None
    names = {wire_name(t): t for t in tools}
    for step in range(1, STEP_LIMIT + 1):
        message = _ask(model, messages, tools, {**ident, "X-Liyagent-Step": str(step)})
        calls = message.get("tool_calls") or []
        if not calls:
            answer = str(message.get("content") or "")
            break
        messages.append(
            {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
        )
        for call in calls:
            name = names[call["function"]["name"]]
            headers = {
                **ident,
                "Idempotency-Key": f"{job_id}:{step}:{call['id']}",
                "X-Liyagent-Call": f"{step}:{call['id']}",
            }
            result = call_tool(name, json.loads(call["function"]["arguments"] or "{}"), headers)
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )
    if answer is None:
        raise RuntimeError(f"job {job_id}: no final answer within {STEP_LIMIT} steps")
    with _engine().connect() as conn:
        conn.execute(
            sa.text("INSERT INTO answers (job_id, answer) VALUES (:j, :a)"),
            {"j": job_id, "a": answer},
        )


def _from_env() -> Celery:
    return make_app(
        os.environ.get("BENCH_BASELINE_BROKER", "redis://127.0.0.1:6379/0"),
        os.environ.get("BENCH_BASELINE_NAMESPACE", "bench:baseline:"),
        os.environ.get("BENCH_BASELINE_QUEUE", "bench-baseline"),
    )


# `celery -A bench.baseline worker` finds this app.
app = _from_env()
