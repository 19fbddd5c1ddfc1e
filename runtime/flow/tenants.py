"""Tenants: no tenant's flood pushes another's runs behind its own.

A run carries a tenant (its owner unless its caller names one). A deployment that sets
`LIYAGENT_TENANT_IN_FLIGHT` bounds each tenant's runs in flight (queued, running, handing an
answer on), scaled per tenant by `LIYAGENT_TENANT_WEIGHTS`. Postgres is the outbox: a new run
past its tenant's bound (or behind its held runs: it never passes them) is stored held (waiting
on `tenant`) and not published; when one of the
tenant's runs ends or waits, its worker admits the tenant's held runs into the room that
freed, highest priority first, then oldest, and publishes them (each sweep admits any it
missed). So the broker never holds more of one tenant's new runs than its bound, and a quiet
tenant's run waits behind at most the other tenants' bounds, never behind their backlogs.

A run already admitted is never held again: its resumes (a loss, a hand-back, a wake) count in
flight but go first (runtime/flow/order.py). A sub-agent's run counts in flight and is never
held: its parent was admitted and waits for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from runtime.base.tenancy import TenantLimits
from store.tenants import Admitted, admit_held, held_tenants, lock_tenant


@contextmanager
def door(conn: sa.Connection, tenant: str, limit: int | None) -> Iterator[None]:
    """Around a start's insert: with a bound, one transaction holding the tenant's lock, so
    the insert counts every run stored before it (store/runs.py `insert_run`)."""
    if limit is None:
        yield
        return
    conn.execution_options(isolation_level="READ COMMITTED")
    with conn.begin():
        lock_tenant(conn, tenant)
        yield


def admit_within(conn: sa.Connection, tenant: str, limit: int | None) -> list[Admitted]:
    """Inside `door` (the tenant's lock held): admit its held runs into the room it has."""
    return admit_held(conn, tenant, limit)


def admit(engine: sa.Engine, limits: TenantLimits, tenant: str | None) -> list[Admitted]:
    """Admit the tenant's held runs into the room it has now, as a run of it ends (none when
    tenants are not bounded: nothing is held then, and what a lifted bound left held is the
    sweep's, `admit_every`): each is queued at its first attempt, to be published at its
    priority by the caller."""
    limit = None if tenant is None else limits.limit_of(tenant)
    if tenant is None or limit is None:
        return []
    return _admit(engine, tenant, limit)


def _admit(engine: sa.Engine, tenant: str, limit: int | None) -> list[Admitted]:
    """The tenant's held runs admitted under `limit` (None: all), its lock held."""
    with engine.connect() as conn:
        conn.execution_options(isolation_level="READ COMMITTED")
        with conn.begin():
            lock_tenant(conn, tenant)
            return admit_held(conn, tenant, limit)


def admit_every(engine: sa.Engine, limits: TenantLimits) -> list[Admitted]:
    """The sweep's backstop: admit held runs of every tenant that has room (a run that ended
    without its worker admitting, an operator's Stop, a bound raised or lifted). One indexed
    statement finds the tenants with held runs and their runs in flight; only those with room
    are locked and admitted."""
    with engine.connect() as conn:
        found = held_tenants(conn)
    admitted: list[Admitted] = []
    for tenant, in_flight in found.items():
        limit = limits.limit_of(tenant)
        if limit is None or in_flight < limit:
            admitted += _admit(engine, tenant, limit)
    return admitted
