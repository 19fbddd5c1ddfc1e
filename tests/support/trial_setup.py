"""A trial deployment on the suite's servers: the test's own database and Redis namespace, the
vendor simulators recording into a database of their own, the product's own timings (nothing
tuned for the trials); stopped and its vendor database dropped at the end."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from liyagent.local.trials import TrialDeployment
from runtime.base.sealing import parse_keys
from runtime.base.settings import Settings, Timings
from store.admin import create_database, database_url, drop_database


@contextlib.contextmanager
def trial_deployment(
    servers: tuple[str, str],
    db_url: str,
    namespace: str,
    seal_keys: str,
    log_dir: Path,
    tag: str,
) -> Iterator[TrialDeployment]:
    """A deployment to `start` with the trial's options; `tag` names its vendor database."""
    admin_url, redis_url = servers
    vendor_db = f"lyt_{tag}_sim_{uuid.uuid4().hex[:10]}"
    create_database(admin_url, vendor_db)
    settings = Settings(
        database_url=db_url, redis_url=redis_url, namespace=namespace, timings=Timings()
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
