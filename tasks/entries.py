"""Entry-point tasks beat fires: cron triggers, the Teams inbox intake, the answer purge."""

from __future__ import annotations

from runtime.entries import fire_cron, intake_teams
from store.entries import purge_answers
from tasks.app import app
from tasks.services import services


@app.task(name="liyagent.cron_fire", ignore_result=True)
def cron_fire(trigger: str) -> str:
    run_id, created = fire_cron(services(), trigger)
    return f"{run_id} {'started' if created else 'already started by another beat'}"


@app.task(name="liyagent.teams_intake", ignore_result=True)
def teams_intake() -> list[str]:
    return list(intake_teams(services()))


@app.task(name="liyagent.purge_answers", ignore_result=True)
def purge() -> int:
    with services().engine.connect() as conn:
        return purge_answers(conn)
