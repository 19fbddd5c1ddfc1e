"""Postgres out of reach: the one sentence every process says about it (the CLI, a worker that
refuses to start)."""

from __future__ import annotations

import sqlalchemy as sa

from store import db


def database_problem(exc: BaseException, url: str) -> str:
    """What is wrong with the database at `url` and what to do: the sentence the CLI prints
    (exit 3) and a worker refuses to start with. The password never appears."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    why = text.splitlines()[0] if text else type(orig).__name__
    if "database" in why and "does not exist" in why:
        name = sa.make_url(url).database
        advice = f"create it (createdb {name}), then run `liyagent db upgrade`"
    else:
        advice = "start it, or point LIYAGENT_DATABASE_URL at a running server"
    return f"cannot use Postgres at {db.shown(url)} ({why}); {advice}"
