"""A trial deployment on the suite's servers: the test's own database and Redis namespace, the
vendor simulators recording into a database of their own, the product's own timings (nothing
tuned for the trials); stopped and its vendor database dropped at the end."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from liyagent.local.trials import TrialDeployment
from liyagent.local.verdict import Verdict
from runtime.base.sealing import parse_keys
from runtime.base.settings import Settings, Timings
from store.admin import create_database, database_url, drop_database
from store.db import Pooler


@contextlib.contextmanager
def trial_deployment(
    servers: tuple[str, str],
    db_url: str,
    namespace: str,
    seal_keys: str,
    log_dir: Path,
    tag: str,
    *,
    pooled: str | None = None,
) -> Iterator[TrialDeployment]:
    """A deployment to `start` with the trial's options; `tag` names its vendor database;
    `pooled`: the same database's URL through PgBouncer, which every process of the deployment
    (and the judge) then goes through."""
    admin_url, redis_url = servers
    vendor_db = f"lyt_{tag}_sim_{uuid.uuid4().hex[:10]}"
    create_database(admin_url, vendor_db)
    settings = Settings(
        database_url=pooled or db_url,
        database_pooler=Pooler.PGBOUNCER if pooled else Pooler.NONE,
        redis_url=redis_url,
        namespace=namespace,
        timings=Timings(),
    )
    deployment = TrialDeployment(
        settings=settings,
        seal_keys=seal_keys,
        sealer=parse_keys(seal_keys),
        vendor_db_url=database_url(admin_url, vendor_db),
        log_dir=log_dir,
    )
    try:
        yield deployment
    finally:
        deployment.stop()
        drop_database(admin_url, vendor_db)


def assert_no_trial_failed(verdict: Verdict) -> None:
    """The spec's table but for each trial's time to end (bounded by its caller): no trial
    lost, no duplicate or stale write, and some victim had work in flight when it died."""
    assert verdict.lost == [], f"lost trials: {verdict.lost} (seed {verdict.seed})"
    assert verdict.duplicates == 0, f"duplicate writes {verdict.duplicate_writes}"
    assert verdict.stale_writes == 0, f"written after a takeover: {verdict.stale_detail}"
    assert verdict.caught_in_flight > 0, "no victim had work in flight when it died"
