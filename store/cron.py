"""Cron's statements: the record of one trigger's scheduled time, linked to its run in the
run's inserting statement and given the run's outcome in its ending one (once)."""

from __future__ import annotations

from datetime import datetime

from store.entry_links import EntryLink

KIND = "cron"


def cron_link(trigger: str, scheduled_at: datetime) -> EntryLink:
    """The `cron_runs` record of `trigger` at `scheduled_at`, inserted with its run."""
    return EntryLink(
        KIND,
        "link AS (INSERT INTO cron_runs (trigger, scheduled_at, run_id) "
        "SELECT :link_ref, :link_at, id FROM r)",
        {"link_ref": trigger, "link_at": scheduled_at},
    )


def cron_end(source: str, *, success: bool, outcome_sql: str, where: str) -> str:
    """The record succeeded or failed with the run's outcome, once (`EntryEnd`)."""
    status = "succeeded" if success else "failed"
    return f"""e_cron AS (
        UPDATE cron_runs SET status = '{status}', outcome = {outcome_sql}, recorded_at = now()
        FROM {source} WHERE cron_runs.run_id = {source}.id AND cron_runs.recorded_at IS NULL
          AND {where})"""
