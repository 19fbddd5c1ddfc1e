"""Budgets as the store keeps them (issue 34, item 4): a run's on its row (`budget_tokens`,
`budget_usd`), an agent's or a tenant's per period in `budgets` with the period's spend.

A run's spend is read once when its attempt starts (`attempt_spend`) and kept in process from
then on, so a per-run budget costs no statement per request. An agent's or a tenant's is a
shared counter: one conditional UPDATE reserves a request's bound against what the period has
left (`reserve`), one settles it to the response's usage (`settle`); a reservation never settled
(its attempt was lost) stays spent. Raising a budget and waking the runs waiting on it is one
statement (`raise_run`, `set_budget`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from store.db import sql
from store.rows import Attempt, RunId
from store.scope import Scope

# What a run waits on while one of its budgets is exhausted (runtime/flow/budgets.py words it):
# `budget:run:<tokens>:<usd>` (the budget it found short, `-` for none), or
# `budget:<scope>:<period>:<period's end, epoch s>:<its limits' set_at, epoch s>:<name>`. Each
# names the budget as the attempt saw it, so a raise that came between the attempt's check and
# its suspension is seen by the sweeper (`WAKE_SQL`): no wake is lost to that race.
WAIT_PREFIX = "budget:"
RUN_WAIT = "budget:run:"
SCOPED_WAIT = ("budget:agent:", "budget:tenant:")

# The runs `r` whose budget wait is over (store/waits.py `wake_ready`, the sweeper's backstop):
# a run budget raised since it was found short; an agent's or tenant's period turned, or its
# limits set since.
WAKE_SQL = """
    (r.waiting_on LIKE 'budget:run:%'
     AND (split_part(r.waiting_on, ':', 3) <> coalesce(CAST(r.budget_tokens AS text), '-')
          OR split_part(r.waiting_on, ':', 4) <> coalesce(CAST(r.budget_usd AS text), '-')))
    OR ((r.waiting_on LIKE 'budget:agent:%' OR r.waiting_on LIKE 'budget:tenant:%')
        AND (to_timestamp(CAST(split_part(r.waiting_on, ':', 4) AS float8)) <= now()
             OR EXISTS (
                SELECT 1 FROM budgets b
                WHERE r.waiting_on = 'budget:' || b.scope || ':' || b.period || ':'
                      || split_part(r.waiting_on, ':', 4) || ':'
                      || split_part(r.waiting_on, ':', 5) || ':' || b.name
                  AND CAST(extract(epoch FROM b.set_at) AS numeric(20, 6))
                      > CAST(split_part(r.waiting_on, ':', 5) AS numeric))))"""

# The period a budget row's spend counts in, as Postgres computes it (UTC).
_PERIOD_START = "date_trunc(b.period, now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
# When the period starting at `start` (a timestamptz) ends: a day or a month later in UTC,
# whatever the session's time zone (an interval added to a timestamptz counts days and months
# in the session's zone, so on a server set to another zone a period would end hours off).
_END_OF = "(({start}) AT TIME ZONE 'UTC' + CAST('1 ' || {period} AS interval)) AT TIME ZONE 'UTC'"
# The period's spend so far: nothing when its stored spend is of a period that has ended.
_SPENT_TOKENS = f"CASE WHEN b.period_start = {_PERIOD_START} THEN b.spent_tokens ELSE 0 END"
_SPENT_USD = f"CASE WHEN b.period_start = {_PERIOD_START} THEN b.spent_usd ELSE 0 END"
# The budget rows a run of agent :agent and tenant :tenant is under.
_APPLIES = "((b.scope = 'agent' AND b.name = :agent) OR (b.scope = 'tenant' AND b.name = :tenant))"


@dataclass(frozen=True)
class ModelSpend:
    """The tokens a run's written steps of one model reported (its cost is the caller's: the
    deployment's price table, runtime/models/prices.py)."""

    model: str | None
    input_tokens: int
    output_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class AttemptSpend:
    """What an attempt starts from: its run's spend by model, and whether an agent's or a
    tenant's budget applies to it (then each request reserves against it)."""

    by_model: list[ModelSpend]
    scoped: bool


@dataclass(frozen=True)
class Reservation:
    """A request's bound reserved in every agent and tenant budget it is under, in each one's
    period holding `at` (settled in those periods only: one that has turned since keeps it as
    spent, and the new period is never charged for it), and in those budgets only (`keys`: a
    budget set after the reservation never has it taken off)."""

    agent: str
    tenant: str
    tokens: int
    usd: Decimal
    # When it was reserved (the database's clock): the periods it was reserved in.
    at: datetime
    # The budget rows it was reserved in, (scope, name, period), as the reserve updated them.
    keys: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class Exhausted:
    """The first budget row too short for the request: scope, name, period, when it ends, and
    when its limits were set (epoch seconds, as text: compared exactly by the sweeper)."""

    scope: str
    name: str
    period: str
    ends: datetime
    set_at: str
    # Short because it is in dollars and the request could not be priced (its model has none).
    unpriced: bool = False


@dataclass(frozen=True)
class BudgetRow:
    scope: str
    name: str
    period: str
    tokens: int | None
    usd: Decimal | None
    spent_tokens: int
    spent_usd: Decimal
    ends: datetime


def run_budget_params(tokens: int | None = None, usd: Decimal | None = None) -> dict[str, Any]:
    """The bind parameters `:budget_tokens, :budget_usd` of the statement inserting a run
    (store/runs.py `insert_run`): what it may spend, None for no bound."""
    return {"budget_tokens": tokens, "budget_usd": usd}


def any_budgets(conn: sa.Connection) -> bool:
    """Whether any agent or tenant budget is set (a worker's cached fact: runtime/core/)."""
    return bool(conn.execute(sql("SELECT EXISTS (SELECT 1 FROM budgets)")).scalar())


def attempt_spend(conn: sa.Connection, run_id: str, agent: str, tenant: str) -> AttemptSpend:
    """The run's spend by model over its written steps, and whether a scoped budget applies, in
    one statement (read once when an attempt starts).

    This is THE spend rule of a run's budget: what its written steps reported, and what its
    lost attempts may have been billed for the steps they never wrote (the ledger's
    unconfirmed usage, store/ledger.py: their reservations' bounds), so a resumed run counts
    what its lost attempts were billed."""
    rows = conn.execute(
        sql(
            f"""
            WITH spent AS (
                SELECT s.model, s.input_tokens, s.output_tokens, s.cached_tokens
                FROM run_steps s WHERE s.run_id = CAST(:run_id AS uuid)
                UNION ALL
                SELECT r.answer_model, r.answer_input_tokens, r.answer_output_tokens,
                       r.answer_cached_tokens
                FROM runs r WHERE r.id = CAST(:run_id AS uuid)
                UNION ALL
                SELECT u.model, u.input_tokens, u.output_tokens, 0
                FROM usage_unconfirmed u WHERE u.run_id = CAST(:run_id AS uuid))
            SELECT model, coalesce(sum(input_tokens), 0) AS i,
                   coalesce(sum(output_tokens), 0) AS o, coalesce(sum(cached_tokens), 0) AS c,
                   EXISTS (SELECT 1 FROM budgets b WHERE {_APPLIES}) AS scoped
            FROM spent GROUP BY model
            UNION ALL
            SELECT NULL, 0, 0, 0, EXISTS (SELECT 1 FROM budgets b WHERE {_APPLIES})
            """
        ),
        {"run_id": run_id, "agent": agent, "tenant": tenant},
    ).all()
    by_model = [
        ModelSpend(r.model, int(r.i), int(r.o), int(r.c)) for r in rows if r.i or r.o or r.c
    ]
    return AttemptSpend(by_model, bool(rows[-1].scoped))


def reserve(
    conn: sa.Connection, agent: str, tenant: str, tokens: int, usd: Decimal | None
) -> Reservation | Exhausted | None:
    """Reserve a request's bound (`tokens`; `usd`, None when it cannot be priced) in every
    budget the run's agent and tenant are under, all or none, in one statement: the rows are
    locked in key order (two reservations never deadlock), each period's spend restarted when
    its period turned. Returns the reservation, the first budget too short (nothing reserved;
    one in dollars for an unpriced request first), or None when none applies."""
    # One conditional statement a request (the budgets' own invariant: a period never spends
    # past its limit by more than one request's reservation, however many workers reserve).
    row = conn.execute(
        sql(
            f"""
            WITH locked AS (
                SELECT b.scope, b.name, b.period, b.tokens, b.usd, b.set_at,
                       {_SPENT_TOKENS} AS t, {_SPENT_USD} AS u, {_PERIOD_START} AS starts
                FROM budgets b WHERE {_APPLIES}
                ORDER BY b.scope, b.name, b.period FOR UPDATE),
            short AS (
                -- A budget in dollars for a request that cannot be priced (:usd NULL) is
                -- short too: its cost is unknown, never 0.
                SELECT scope, name, period, starts, set_at,
                       usd IS NOT NULL AND CAST(:usd AS numeric) IS NULL AS unpriced
                FROM locked
                WHERE (tokens IS NOT NULL AND t + :tokens > tokens)
                   OR (usd IS NOT NULL AND (CAST(:usd AS numeric) IS NULL OR u + :usd > usd))
                ORDER BY unpriced DESC, scope, name, period LIMIT 1),
            r AS (
                UPDATE budgets b SET period_start = l.starts, spent_tokens = l.t + :tokens,
                       spent_usd = l.u + coalesce(CAST(:usd AS numeric), 0)
                FROM locked l
                WHERE (b.scope, b.name, b.period) = (l.scope, l.name, l.period)
                  AND NOT EXISTS (SELECT 1 FROM short)
                RETURNING b.scope, b.name, b.period)
            SELECT (SELECT count(*) FROM locked) AS applies, now() AS at,
                   (SELECT count(*) FROM r) AS reserved,
                   (SELECT coalesce(jsonb_agg(jsonb_build_array(scope, name, period)), '[]')
                    FROM r) AS reserved_keys,
                   s.scope, s.name, s.period, s.unpriced,
                   {_END_OF.format(start="s.starts", period="s.period")} AS ends,
                   CAST(CAST(extract(epoch FROM s.set_at) AS numeric(20, 6)) AS text) AS set_at
            FROM (SELECT 1) one LEFT JOIN short s ON TRUE
            """
        ),
        {"agent": agent, "tenant": tenant, "tokens": tokens, "usd": usd},
    ).one()
    if row.applies == 0:
        return None
    if row.scope is not None:
        return Exhausted(row.scope, row.name, row.period, row.ends, row.set_at, row.unpriced)
    keys = tuple((str(k[0]), str(k[1]), str(k[2])) for k in row.reserved_keys)
    return Reservation(agent, tenant, tokens, usd or Decimal(0), row.at, keys)


def settle(conn: sa.Connection, reservation: Reservation, tokens: int, usd: Decimal) -> None:
    """Replace a reservation with what the request spent (`tokens`, `usd`: its response's
    usage, or the reservation itself when the provider said none), in the budget rows it was
    reserved in (`reservation.keys`: one set since, say a tenant's budget created after it,
    holds others' reservations, never this one's) and the periods it was reserved in (a
    period that has turned since keeps the reservation as spent). The rows are locked in the
    order `reserve` locks them, so the two never deadlock."""
    # One statement, matching only the rows the reservation's own statement updated: each
    # reservation comes off once and only where it was added (the budgets' own invariant).
    conn.execute(
        sql(
            """
            WITH locked AS (
                SELECT b.scope, b.name, b.period FROM budgets b
                WHERE (b.scope, b.name, b.period) IN (
                        SELECT * FROM unnest(CAST(:scopes AS text[]), CAST(:names AS text[]),
                                             CAST(:periods AS text[])))
                  AND b.period_start = date_trunc(
                    b.period, CAST(:at AS timestamptz) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                ORDER BY b.scope, b.name, b.period FOR UPDATE)
            UPDATE budgets b
            SET spent_tokens = greatest(b.spent_tokens - :rt + :tokens, 0),
                spent_usd = greatest(b.spent_usd - :ru + :usd, 0)
            FROM locked l WHERE (b.scope, b.name, b.period) = (l.scope, l.name, l.period)
            """
        ),
        {
            "scopes": [k[0] for k in reservation.keys],
            "names": [k[1] for k in reservation.keys],
            "periods": [k[2] for k in reservation.keys],
            "at": reservation.at,
            "rt": reservation.tokens,
            "ru": reservation.usd,
            "tokens": tokens,
            "usd": usd,
        },
    )


def raise_run(
    conn: sa.Connection,
    run_id: str,
    tokens: int | None,
    usd: Decimal | None,
    scope: Scope | None = None,
) -> tuple[bool, Attempt | None]:
    """Set the run's budget to `tokens` and/or `usd` (the other kept) and, when it waits on its
    budget, wake it (waiting -> queued, attempt + 1), in one statement; (found, the woken
    attempt or None). `scope` (a front principal's) sees only its runs: another's is not found."""
    seen = "TRUE" if scope is None else scope.sees("r")
    # One conditional statement (I4: a waiting run is woken once, however many raise it at
    # once: the row is locked, and only the raise that still finds it waiting wakes it).
    row = conn.execute(
        sql(
            f"""
            WITH old AS (
                SELECT r.id, r.status = 'waiting' AND r.waiting_on LIKE '{RUN_WAIT}%' AS waits
                FROM runs r WHERE r.id = CAST(:id AS uuid) AND {seen} FOR UPDATE)
            UPDATE runs SET
                budget_tokens = coalesce(CAST(:tokens AS bigint), budget_tokens),
                budget_usd = coalesce(CAST(:usd AS numeric), budget_usd),
                status = CASE WHEN old.waits THEN 'queued' ELSE status END,
                attempt = CASE WHEN old.waits THEN attempt + 1 ELSE attempt END,
                deliveries = CASE WHEN old.waits THEN 0 ELSE deliveries END,
                resume_reason = CASE WHEN old.waits THEN 'wait_over' ELSE resume_reason END,
                queued_at = CASE WHEN old.waits THEN now() ELSE queued_at END,
                waiting_on = CASE WHEN old.waits THEN NULL ELSE waiting_on END,
                updated_at = now()
            FROM old WHERE runs.id = old.id
            RETURNING runs.attempt, old.waits
            """
        ),
        {"id": run_id, "tokens": tokens, "usd": usd, **({} if scope is None else scope.params())},
    ).first()
    if row is None:
        return False, None
    return True, (Attempt(row.attempt) if row.waits else None)


def set_budget(
    conn: sa.Connection,
    scope: str,
    name: str,
    period: str,
    tokens: int | None,
    usd: Decimal | None,
    keep: frozenset[str] = frozenset(),
) -> list[tuple[RunId, Attempt]]:
    """Set an agent's or a tenant's budget for a period (a new one starts with nothing spent;
    an existing one keeps its period's spend, and the amounts in `keep`, "tokens" or "usd")
    and wake the runs waiting on it, in one statement (each wakes, re-reserves, and waits again
    if the budget is still short)."""
    rows = conn.execute(
        sql(
            """
            WITH b AS (
                INSERT INTO budgets (scope, name, period, tokens, usd)
                VALUES (:scope, :name, :period, :tokens, :usd)
                ON CONFLICT (scope, name, period)
                DO UPDATE SET
                    tokens = CASE WHEN :keep_tokens THEN budgets.tokens ELSE excluded.tokens END,
                    usd = CASE WHEN :keep_usd THEN budgets.usd ELSE excluded.usd END,
                    set_at = now()
                RETURNING scope, name, period)
            UPDATE runs r SET status = 'queued', attempt = attempt + 1, deliveries = 0,
                   resume_reason = 'wait_over', waiting_on = NULL, queued_at = now(),
                   updated_at = now()
            FROM b
            WHERE r.status = 'waiting' AND r.waiting_on LIKE 'budget:%'
              AND r.waiting_on = 'budget:' || b.scope || ':' || b.period || ':'
                  || split_part(r.waiting_on, ':', 4) || ':' || split_part(r.waiting_on, ':', 5)
                  || ':' || b.name
            RETURNING r.id, r.attempt
            """
        ),
        {
            "scope": scope,
            "name": name,
            "period": period,
            "tokens": tokens,
            "usd": usd,
            "keep_tokens": "tokens" in keep,
            "keep_usd": "usd" in keep,
        },
    ).all()
    return [(RunId(r.id), Attempt(r.attempt)) for r in rows]


def list_budgets(conn: sa.Connection) -> list[BudgetRow]:
    """Every agent's and tenant's budget with its current period's spend and end."""
    rows = conn.execute(
        sql(
            f"""
            SELECT b.scope, b.name, b.period, b.tokens, b.usd, {_SPENT_TOKENS} AS spent_tokens,
                   {_SPENT_USD} AS spent_usd,
                   {_END_OF.format(start=_PERIOD_START, period="b.period")} AS ends
            FROM budgets b ORDER BY b.scope, b.name, b.period
            """
        )
    ).all()
    return [BudgetRow(**r._mapping) for r in rows]
