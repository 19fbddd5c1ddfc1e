"""A worker whose database goes away while runs are queued holds the run messages it took
(never acked, never dropped), backs off, says so once per interval naming the database and what
to do, and once Postgres answers again every run completes; a warm shutdown meanwhile hands its
messages back to the queue. The worker reaches Postgres through a proxy the test cuts, while
the test itself still reaches it (to start runs and judge them)."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
import redis
import sqlalchemy as sa

from liyagent.local.servers import free_port
from runtime.flow.order import bucket_keys
from tasks.deliveries import held_runs
from tests.support.judge import judge_runs
from tests.support.proxy import CuttableProxy
from tests.support.scripts import mixed

PASSWORD = "pw-s3cret"  # trust auth ignores it; it must never reach a log line


def _through_proxy(stack) -> tuple[CuttableProxy, str]:
    """A proxy to the test's Postgres and the worker's database URL through it."""
    url = sa.make_url(stack.settings.database_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432)
    through = url.set(host="127.0.0.1", port=proxy.port, password=PASSWORD)
    return proxy, through.render_as_string(hide_password=False)


def _held(stack) -> list[str]:
    """Run ids whose message Redis holds: waiting in the queue, or taken and not acked."""
    client = redis.Redis.from_url(stack.settings.redis_url)
    held = held_runs(client, stack.settings.namespace, stack.settings.queue)(1_000_000)
    client.close()
    assert held is not None
    return sorted(run_id for run_id, _ in held.waiting | held.delivered)


def test_a_worker_whose_database_goes_away_holds_its_messages_and_says_so_once_per_interval(
    stack,
) -> None:
    proxy, worker_url = _through_proxy(stack)
    database = sa.make_url(stack.settings.database_url).database
    worker = stack.worker("w1", env={"LIYAGENT_DATABASE_URL": worker_url})
    stack.beat()  # sweeps and intakes fire at this worker too, every second
    proxy.cut()
    before = len(worker.output().splitlines())
    run_ids = [stack.start(mixed(str(i))) for i in range(6)]
    worker.wait_for(r"database\.unreachable|message\.requeued", timeout=30)
    time.sleep(10)  # the outage lasts: what the worker says meanwhile is judged below

    # A few lines in all (Celery's own "received" ones included), where the worker used to
    # write a traceback per message and per try (the issue counted 1,718 lines in 20 s).
    said = worker.output().splitlines()[before:]
    assert len(said) <= 20, "\n".join(said)
    outage = [line for line in said if "database.unreachable" in line]
    assert 1 <= len(outage) <= 3, "\n".join(said)
    for line in outage:
        assert f"127.0.0.1:{proxy.port}/{database}" in line
        assert "start it, or point LIYAGENT_DATABASE_URL at a running server" in line
    assert PASSWORD not in "\n".join(said) and "Traceback" not in "\n".join(said)
    # Nothing was acked and lost: every run's message is still in Redis, every run queued.
    assert sorted(set(_held(stack)) & set(run_ids)) == sorted(run_ids)
    assert {stack.client.get(r).status for r in run_ids} == {"queued"}

    CuttableProxy(proxy.target[0], proxy.target[1], port=proxy.port)  # the database is back
    for run_id in run_ids:
        assert stack.wait(run_id, timeout=60).status == "succeeded"
    assert worker.output().count("database.reachable") == 1, "\n".join(
        line for line in worker.output().splitlines() if "database." in line
    )


def test_a_worker_stopped_during_an_outage_hands_its_messages_back_to_the_queue(stack) -> None:
    proxy, worker_url = _through_proxy(stack)
    worker = stack.worker("w1", env={"LIYAGENT_DATABASE_URL": worker_url}, ops=False)
    proxy.cut()
    run_id = stack.start([{"final": "Done."}])
    worker.wait_for(r"database\.unreachable", timeout=30)
    worker.popen.send_signal(signal.SIGTERM)  # warm shutdown: the held message goes back
    try:
        worker.popen.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no warm shutdown in 60 s:\n{worker.output()[-6000:]}") from None
    client = redis.Redis.from_url(stack.settings.redis_url)
    queue_key = f"{stack.settings.namespace}{stack.settings.queue}"
    assert sum(client.llen(key) for key in bucket_keys(queue_key)) == 1
    client.close()
    assert _held(stack) == [run_id]
    assert stack.client.get(run_id).status == "queued"
    stack.worker("w2")  # reaches Postgres directly
    assert stack.wait(run_id).status == "succeeded"


def test_a_statement_that_fails_on_a_server_that_answers_is_not_an_outage(db_url) -> None:
    from store import db

    engine = db.create(db_url)
    with pytest.raises(sa.exc.OperationalError) as timed_out, engine.connect() as conn:
        conn.execute(sa.text("SET statement_timeout = 1"))
        conn.execute(sa.text("SELECT pg_sleep(1)"))
    assert not db.unreachable(timed_out.value)  # QueryCanceled: the server answered
    closed = db.create(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x")
    with pytest.raises(sa.exc.OperationalError) as refused:
        db.ping(closed)
    assert db.unreachable(refused.value)
    engine.dispose()
    closed.dispose()


def test_a_connection_to_a_server_that_takes_no_writes_is_dropped_from_the_pool(db_url) -> None:
    """A server that went read-only under a pooled connection (a primary demoted) refuses the
    write with read_only_sql_transaction: that is an outage, not a failed statement, and the
    connection is dropped, so the next statement opens a new one (a multi-host URL then finds
    the writable host)."""
    from store import db

    engine = db.create(db_url, pool_max=1)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SET default_transaction_read_only = on"))
        with pytest.raises(sa.exc.InternalError) as refused, engine.connect() as conn:
            conn.execute(sa.text("CREATE TEMP TABLE t (x int)"))  # the same pooled connection
        assert db.unreachable(refused.value)
        with engine.connect() as conn:  # a new connection: writable again
            conn.execute(sa.text("CREATE TEMP TABLE t (x int)"))
    finally:
        engine.dispose()


def test_a_run_whose_postgres_goes_away_mid_step_is_given_back_without_a_loss(stack) -> None:
    """The vendor took a keyed write and Postgres went away before its outcome was recorded:
    the worker keeps the lease and waits, then gives the run back as a store fault (no loss
    charged); the resume reads Postgres again, finds the call in doubt and sends it again with
    the same key (the vendor dedupes), and no model step is asked twice (I2, I5)."""
    import os

    proxy, worker_url = _through_proxy(stack)
    stack.worker("victim", fault="after_send:stop", env={"LIYAGENT_DATABASE_URL": worker_url})
    stack.beat()
    run_id = stack.start(mixed("o"))
    stopped = int(stack.fault_hit("victim").split()[1])  # the incident was created
    proxy.cut()  # every connection of the worker drops, as a primary killed
    os.kill(stopped, signal.SIGCONT)  # well inside its lease: the heartbeat keeps it
    time.sleep(3)  # the outage: the run waits, its lease kept
    assert stack.client.get(run_id).lost_count == 0
    CuttableProxy(proxy.target[0], proxy.target[1], port=proxy.port)  # Postgres is back
    assert stack.wait(run_id, timeout=60).status == "succeeded"

    judge_runs(stack, [run_id]).assert_clean()  # no duplicate, nothing after the give-back
    run = stack.client.get(run_id)
    assert run.lost_count == 0 and run.attempt == 2
    audits = stack.rows(
        "SELECT kind, detail->>'reason' AS reason FROM audit_events WHERE run_id = :r "
        "AND kind IN ('agent.run.lost', 'agent.run.store_fault', 'agent.run.error')",
        r=run_id,
    )
    assert [(a.kind, a.reason) for a in audits] == [("agent.run.store_fault", "store_fault")]
    assert set(stack.asked(run_id).values()) == {1}  # every step asked once
    created = stack.vendor(
        "SELECT count(*) AS n FROM sim.requests WHERE run_id = :r AND vendor = 'incidents' "
        "AND method = 'POST' AND status = 201",
        r=run_id,
    )
    assert created[0].n == 1


def test_a_billed_answer_whose_step_postgres_never_took_is_recorded_by_the_give_back(
    stack,
) -> None:
    """The model answered step 1 (the server billed it) and Postgres went away before the step
    was written: the worker waits, gives the run back as a store fault (no loss, so no claim
    records anything) and the resume asks step 1 again. The give-back itself records what the
    first answer was billed, exactly (the worker held its usage), as unconfirmed usage of the
    attempt that never wrote it, once; the run's spend counts it (the ledger judged from the
    model server's bills)."""
    import os

    from tests.support.ledger import uncovered

    proxy, worker_url = _through_proxy(stack)
    stack.worker("victim", fault="after_model_step:stop", env={"LIYAGENT_DATABASE_URL": worker_url})
    stack.beat()
    run_id = stack.start(mixed("b"))
    stopped = int(stack.fault_hit("victim").split()[1])  # step 1 answered and billed
    proxy.cut()  # its checkpoint's write finds Postgres gone
    os.kill(stopped, signal.SIGCONT)
    time.sleep(3)  # the outage: the run waits, its lease kept
    CuttableProxy(proxy.target[0], proxy.target[1], port=proxy.port)  # Postgres is back
    assert stack.wait(run_id, timeout=60).status == "succeeded"

    run = stack.client.get(run_id)
    assert run.lost_count == 0 and run.attempt == 2  # a store fault, never a loss claim
    assert stack.asked(run_id)[1] == 2  # step 1's first answer was never written
    assert uncovered(stack, run_id) == []
    first = stack.vendor(
        "SELECT prompt_tokens AS i, completion_tokens AS o FROM sim.requests "
        "WHERE vendor = 'model' AND run_id = :r AND status = 200 AND call = '1' ORDER BY id",
        r=run_id,
    )[0]
    recorded = stack.rows(
        "SELECT attempt, step, input_tokens AS i, output_tokens AS o, model "
        "FROM usage_unconfirmed WHERE run_id = :r",
        r=run_id,
    )
    # The exact usage the worker held, not its note's bound.
    assert [(u.attempt, u.step, u.i, u.o) for u in recorded] == [(1, 1, first.i, first.o)]
    assert recorded[0].model is not None and recorded[0].model.startswith("script-")
    assert run.usage.unconfirmed_input_tokens == first.i
