"""Migrations: one head, and upgrading a fresh database to it gives exactly the models,
constraints and indexes included (which Alembic's autogenerate does not compare)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from bench.bulk import finish_runs
from runtime.base.sealing import new_key_entry, parse_keys
from runtime.durable.definition import RunDefinition, legacy_sealer
from store import migrate
from store.runs import get_run
from store.schema import metadata

CATALOG = """
SELECT 'constraint' AS what, conrelid::regclass::text AS tbl, conname AS name,
       pg_get_constraintdef(oid) AS def
FROM pg_constraint WHERE connamespace = 'public'::regnamespace
  AND conrelid::regclass::text <> 'alembic_version'
UNION ALL
SELECT 'index', tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
  AND tablename <> 'alembic_version'
"""


@contextmanager
def _database(admin_engine, servers) -> Iterator[str]:
    name = f"lyt_mig_{uuid.uuid4().hex[:12]}"
    with admin_engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield sa.make_url(servers[0]).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin_engine.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def _catalog(url: str) -> set[tuple[str, str, str, str]]:
    engine = sa.create_engine(url, hide_parameters=True)
    with engine.connect() as conn:
        rows = {tuple(r) for r in conn.execute(sa.text(CATALOG)).all()}
    engine.dispose()
    return rows


def test_single_head() -> None:
    script = ScriptDirectory.from_config(migrate.config("postgresql://unused"))
    assert len(script.get_heads()) == 1


def test_upgrade_to_head_matches_the_models(admin_engine, servers) -> None:
    with _database(admin_engine, servers) as migrated, _database(admin_engine, servers) as built:
        migrate.upgrade(migrated)
        engine = sa.create_engine(migrated, hide_parameters=True)
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        engine.dispose()
        created = sa.create_engine(built, hide_parameters=True)
        metadata.create_all(created)
        created.dispose()
        assert _catalog(migrated) == _catalog(built)


def test_downgrade_to_base_and_back(admin_engine, servers) -> None:
    with _database(admin_engine, servers) as url:
        migrate.upgrade(url)
        cfg = migrate.config(url)
        cfg.set_main_option("sqlalchemy.url", url)
        command.downgrade(cfg, "base")
        assert {r[2] for r in _catalog(url)} == set()
        migrate.upgrade(url)


# The revision before definitions were sealed: runs there keep a plain `spec`.
BEFORE_SEALED = "0015_principal_scope"
LEGACY_SPEC = {
    "model": {"provider": "scripted", "script": {"steps": [{"final": "done"}]}},
    "tools": ["ticket.read"],
    "system": "Be brief.",
    "may_wait": True,
    "entry": {},
}


def _legacy_run(conn: sa.Connection, status: str = "running") -> str:
    """A run as the code before sealed definitions stored it."""
    run_id = str(uuid.uuid4())
    conn.execute(
        sa.text(
            "INSERT INTO runs (id, correlation_id, agent, owner, spec, status) "
            "VALUES (CAST(:id AS uuid), CAST(:id AS text), 'support-bot', 'pat', "
            "CAST(:spec AS jsonb), :status)"
        ),
        {"id": run_id, "spec": json.dumps(LEGACY_SPEC), "status": status},
    )
    return run_id


def test_sealing_definitions_seals_unfinished_runs_with_the_keys_and_refuses_without(
    admin_engine, servers
) -> None:
    """Migration 0016: an unfinished run's plain spec becomes its sealed definition (opened as a
    worker opens it); without the seal keys, or with keys that did not seal its checkpoint (a
    shell's development key), it is refused, nothing changed; a finished run's spec is dropped
    (nothing reads it again); a downgrade waits for unfinished runs."""
    sealer = parse_keys(new_key_entry("mig"))
    with _database(admin_engine, servers) as url:
        migrate.upgrade(url, BEFORE_SEALED)
        engine = sa.create_engine(url, hide_parameters=True)
        with engine.begin() as conn:
            waiting = _legacy_run(conn, "waiting")
            done = _legacy_run(conn, "succeeded")
            conn.execute(
                sa.text("UPDATE runs SET checkpoint = :c WHERE id = :r"),
                {"c": sealer.seal(waiting, "checkpoint", 0, {"messages": []}), "r": waiting},
            )
        with pytest.raises(RuntimeError, match="1 unfinished runs need their definitions sealed"):
            migrate.upgrade(url)
        stranger = legacy_sealer(parse_keys(new_key_entry("dev1")))
        with pytest.raises(RuntimeError, match="sealed with key id 'mig', which the keys given"):
            migrate.upgrade(url, seal_definition=stranger)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT spec FROM runs WHERE id = :r"), {"r": waiting})
        migrate.upgrade(url, seal_definition=legacy_sealer(sealer))
        with engine.connect() as conn:
            opened = RunDefinition.open(sealer, get_run(conn, waiting))
            assert get_run(conn, done).definition is None
        assert opened.tools == ["ticket.read"] and opened.system == "Be brief."
        assert opened.model == LEGACY_SPEC["model"] and opened.owner == "pat"
        cfg = migrate.config(url)
        cfg.set_main_option("sqlalchemy.url", url)
        with pytest.raises(RuntimeError, match="1 unfinished runs have sealed definitions"):
            command.downgrade(cfg, BEFORE_SEALED)
        with engine.begin() as conn:
            finish_runs(conn, [waiting])
        engine.dispose()
        command.downgrade(cfg, BEFORE_SEALED)


def test_downgrade_past_step_records_waits_for_runs_that_have_them(admin_engine, servers) -> None:
    """The code before step records reads only a whole-state checkpoint: a downgrade past
    `step_records` is refused while an unfinished run has records, and goes once it finished."""
    with _database(admin_engine, servers) as url:
        migrate.upgrade(url, BEFORE_SEALED)
        cfg = migrate.config(url)
        cfg.set_main_option("sqlalchemy.url", url)
        engine = sa.create_engine(url, hide_parameters=True)
        with engine.begin() as conn:
            run_id = _legacy_run(conn)
            conn.execute(
                sa.text(
                    "INSERT INTO run_steps (run_id, step, attempt, sealed) VALUES (:r, 1, 1, 'x')"
                ),
                {"r": run_id},
            )
        with pytest.raises(RuntimeError, match="1 unfinished runs have step records"):
            command.downgrade(cfg, "0009")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM run_steps")).scalar() == 1
        with engine.begin() as conn:
            finish_runs(conn, [run_id])
        engine.dispose()
        command.downgrade(cfg, "0009")
        assert "run_steps" not in {r[1] for r in _catalog(url)}


def _teams_turn(conn, run_id: str | None, sender: dict | None, status: str = "replied") -> None:
    """A Teams inbox row as the code before 0014 stored it: the sender's display name (or
    channel id) as `sender`, the activity with its `from` (None: erased)."""
    activity = None if sender is None else {"type": "message", "from": sender}
    conn.execute(
        sa.text(
            "INSERT INTO teams_inbox (message_id, conversation, sender, agent, text, status, "
            "run_id, activity) VALUES (:m, 'conv', :s, 'helper', 'hi', :st, :r, "
            "CAST(:a AS jsonb))"
        ),
        {
            "m": uuid.uuid4().hex,
            "s": "Pat Lee" if sender is None else sender.get("name", sender["id"]),
            "st": status,
            "r": run_id,
            "a": None if activity is None else json.dumps(activity),
        },
    )


def test_teams_owner_ids_carries_runs_and_revocations_from_names_to_ids(
    admin_engine, servers
) -> None:
    """Upgrading to 0014: each Teams run (and its sub-agent runs) is owned by the Entra id its
    activity named, not the display name; a name's revocation stays in force for the people
    whose runs it refused; a waiting turn without an id is failed, never started under a
    name; a run whose activity was erased keeps its owner. A downgrade shows names again."""
    pat, namesake = str(uuid.uuid4()), str(uuid.uuid4()).upper()  # Teams may send any case
    with _database(admin_engine, servers) as url:
        cfg = migrate.config(url)
        cfg.set_main_option("sqlalchemy.url", url)
        command.upgrade(cfg, "0013_event_marks")
        engine = sa.create_engine(url, hide_parameters=True)
        with engine.begin() as conn:
            mine, theirs, child, erased, app = [_legacy_run(conn) for _ in range(5)]
            conn.execute(
                sa.text(
                    "UPDATE runs SET owner = 'Pat Lee', entry_kind = 'teams' "
                    "WHERE id = ANY(CAST(:ids AS uuid[]))"
                ),
                {"ids": [mine, theirs, child, erased]},
            )
            conn.execute(
                sa.text("UPDATE runs SET parent_run_id = :p, entry_kind = 'plain' WHERE id = :c"),
                {"p": mine, "c": child},
            )
            conn.execute(sa.text("UPDATE runs SET owner = 'Pat Lee' WHERE id = :a"), {"a": app})
            _teams_turn(conn, mine, {"id": "29:1a", "name": "Pat Lee", "aadObjectId": pat})
            _teams_turn(conn, theirs, {"id": "29:1b", "name": "Pat Lee", "aadObjectId": namesake})
            _teams_turn(conn, erased, None)
            _teams_turn(conn, None, {"id": "29:1c", "name": "Guest"}, status="new")
            conn.execute(
                sa.text(
                    "INSERT INTO principals (name, may_run, may_act, reason) "
                    "VALUES ('Pat Lee', false, true, 'left the company')"
                )
            )
        command.upgrade(cfg, "0014_teams_owner_ids")
        with engine.connect() as conn:
            owners = dict(conn.execute(sa.text("SELECT id::text, owner FROM runs")).all())
            inbox = conn.execute(
                sa.text("SELECT sender_id, status FROM teams_inbox ORDER BY id")
            ).all()
            revoked = conn.execute(
                sa.text("SELECT name, may_run, may_act, reason FROM principals ORDER BY name")
            ).all()
        assert owners == {
            mine: pat,
            theirs: namesake.lower(),
            child: pat,
            erased: "Pat Lee",
            app: "Pat Lee",  # not a Teams run: its owner is the client's
        }
        assert [tuple(r) for r in inbox] == [
            (pat, "replied"),
            (namesake.lower(), "replied"),
            (None, "replied"),
            (None, "failed"),
        ]
        assert sorted(tuple(r) for r in revoked) == sorted(
            [
                ("Pat Lee", False, True, "left the company"),
                (pat, False, True, "left the company"),
                (namesake.lower(), False, True, "left the company"),
            ]
        )
        command.downgrade(cfg, "0013_event_marks")
        with engine.connect() as conn:
            senders = conn.execute(sa.text("SELECT sender FROM teams_inbox ORDER BY id")).all()
        engine.dispose()
        assert [r.sender for r in senders] == ["Pat Lee", "Pat Lee", "", "Guest"]
