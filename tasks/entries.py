"""Entry-point tasks beat fires: cron triggers, the Teams inbox intake, the answer purge."""

from __future__ import annotations

from runtime.entries.cron import fire_cron
from runtime.entries.teams.inbox import intake_teams
from runtime.recovery import outage
from store.entries import purge_answers
from tasks.app import app
from tasks.services import services
from tasks.worker import main_holder


@app.task(name="liyagent.cron_fire", ignore_result=True)
def cron_fire(trigger: str) -> str:
    run_id, created = fire_cron(services(), trigger)
    return f"{run_id} {'started' if created else 'already started by another beat'}"


# The two below fire every few seconds and every few minutes: Postgres out of reach is said
# once per interval (runtime/recovery/outage.py), not as a traceback per fire; the next fire
# catches up.
@app.task(name="liyagent.teams_intake", ignore_result=True)
def teams_intake() -> list[str] | None:
    s = services()
    return outage.tolerated(
        outage.Notice.of(s), main_holder(), lambda: [str(r) for r in intake_teams(s)]
    )


@app.task(name="liyagent.purge_answers", ignore_result=True)
def purge() -> int | None:
    s = services()

    def work() -> int:
        with s.engine.connect() as conn:
            return purge_answers(conn, s.settings.answer_retention_s)

    return outage.tolerated(outage.Notice.of(s), main_holder(), work)
