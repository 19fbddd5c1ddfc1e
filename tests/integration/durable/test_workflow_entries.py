"""Declared Python workflows started by the front's entry points, as cron triggers start them:
a webhook that names a workflow (its `params` the workflow's), a ticket event that names one
(the event's ticket, type and text its parameters); once per event id, carried to their end by
a real worker; bad input refused with nothing stored."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from front.app import create_app
from runtime import services as runtime_services
from tests.support.py_flows import waiting_on

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

AUTH = {"Authorization": "Bearer t0k"}


@pytest.fixture
def front(flows):
    settings = replace(flows.settings, front_token="t0k")
    services = runtime_services.build(settings, flows.services.publisher, sealer=flows.sealer)
    with TestClient(create_app(services), headers=AUTH) as client:
        yield client
    services.redis.close()


def _runs(stack) -> int:
    return int(stack.rows("SELECT count(*) AS n FROM runs")[0].n)


def test_a_webhook_starts_a_workflow_once_per_event(flows, front) -> None:
    stack = flows
    stack.worker("w1")
    body = {"event_id": "order-9", "params": {"n": 3, "delay_ms": 0}}
    first = front.post("/webhooks/acme.fanout", json=body)
    again = front.post("/webhooks/acme.fanout", json=body)
    assert first.status_code == again.status_code == 202, first.text
    run_id = first.json()["run_id"]
    assert first.json()["created"] is True and again.json() == {"run_id": run_id, "created": False}
    view = stack.wait(run_id, timeout=60)
    assert view.status == "succeeded" and json.loads(view.answer) == ["item-0", "item-1", "item-2"]
    row = stack.rows("SELECT kind, entry_kind FROM runs WHERE id = :r", r=run_id)[0]
    assert (row.kind, row.entry_kind) == ("workflow", "webhook")


def test_a_ticket_event_starts_a_workflow_with_its_fields(flows, front) -> None:
    stack = flows
    stack.worker("w1")
    body = {"event_id": "e-1", "agent": "acme.child", "type": "created", "text": "hello"}
    started = front.post("/tickets/T-9/events", json=body)
    assert started.status_code == 202, started.text
    view = stack.wait(started.json()["run_id"], timeout=60)
    assert view.status == "succeeded", view.failure_reason
    assert json.loads(view.answer) == {"child_of": None, "made": "leaf"}
    params = stack.rows("SELECT input FROM runs WHERE id = :r", r=view.id)[0].input
    assert "T-9" in params and "created" in params and "hello" in params


def test_bad_workflow_starts_are_refused_with_nothing_stored(flows, front) -> None:
    stack = flows
    before = _runs(stack)
    bad_params = front.post(
        "/webhooks/acme.fanout", json={"event_id": "e1", "params": {"n": "many"}}
    )
    assert bad_params.status_code == 400 and "acme.fanout" in bad_params.text
    for params in ([1], [], 0):
        not_object = front.post("/webhooks/acme.fanout", json={"event_id": "e2", "params": params})
        assert not_object.status_code == 400 and "params" in not_object.text
    text_too = front.post("/webhooks/acme.fanout", json={"event_id": "e3", "input": "hi"})
    assert text_too.status_code == 400 and "is a workflow" in text_too.text
    unknown = front.post("/webhooks/acme.nope", json={"event_id": "e4", "input": "hi"})
    assert unknown.status_code == 404 and "acme.fanout" in unknown.text  # names the workflows
    assert _runs(stack) == before


def test_the_front_publishes_an_event_once_per_key(flows, front) -> None:
    stack = flows
    stack.worker("w1")
    run_id = stack.client.start_workflow(workflow="acme.paid", params={"order": "F-6"})
    waiting_on(stack, run_id, "event:")
    body = {"match": "F-6", "payload": {"cents": 7}, "key": "pay-f6"}
    first = front.post("/events/order.paid", json=body)
    again = front.post("/events/order.paid", json=body)
    assert first.status_code == again.status_code == 202, first.text
    assert first.json() == again.json()
    # The shared token holds every right: its events reach every run.
    assert json.loads(stack.wait(run_id, timeout=30).answer)["paid"] == {"cents": 7}
    bad = front.post("/events/order.paid", json={"match": "F-6", "extra": 1})
    assert bad.status_code == 400 and "unknown field" in bad.text
    assert stack.rows("SELECT count(*) AS n FROM workflow_events")[0].n == 1
