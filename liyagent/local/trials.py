"""The kill trials (spec "Kill trials"): rounds that each start a fresh victim worker, begin
cron fires, Teams turns from the durable inbox and webhook calls on it, and SIGKILL it at a
random moment 0.2-4 s after it is up, while a survivor worker and beat recover throughout.

The app front (and the harness) start each round's runs on a queue only victims consume, so the
work a round starts is really on the victim when it dies. Whatever a worker publishes itself
(the death watch's and the sweeper's claims, republished messages) goes to the deployment's one
run queue, which the survivor consumes: a victim leading the death watch when the previous
victim's runs are claimed publishes them there, not to a queue whose only consumer it is and
which nobody reads once the last victim is killed (one CI run left three runs there until the
outbox's 30 s republish). The timings are the product's (lease 8 s, sweep 3 s).

Every other round hands the death watch's lead to the victim once it is up (as if it had
started first), so the report times the death of a leading worker as often as a following one;
whether the victim led is read from Redis at the kill, not assumed.
"""

from __future__ import annotations

import json
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
import structlog
from celery import Celery

import celeryconfig
from liyagent.local import sim_model
from liyagent.local.botframework import BotChannel
from liyagent.local.cluster import Cluster, child_env
from liyagent.local.verdict import Trial, Verdict, Victim, judge_trials
from runtime import services as runtime_services
from runtime.base.sealing import Sealer
from runtime.base.settings import Settings
from runtime.entries.cron import fire_cron
from runtime.recovery.deaths import death_watch_leader, hand_lead
from runtime.services import holder_of
from tasks.services import CeleryPublisher

log = structlog.get_logger(__name__)

CRON_TRIGGER = "trial-cron"
TEAMS = "trial-teams"
# An old, fixed base for the trials' cron slots: one slot per round, never a real hour.
CRON_BASE = datetime(2001, 1, 1, tzinfo=UTC)


# What a drain that timed out prints: the runs not ended (at most 40, oldest change first),
# and the last lines of each process's log.
STUCK_SQL = """
    SELECT CAST(id AS text) AS id, kind, status, attempt, lost_count, waiting_on, claimed_by,
           step, CAST(updated_at AS text) AS updated_at
    FROM runs WHERE status NOT IN ('succeeded', 'failed') ORDER BY updated_at LIMIT 40"""
STUCK_LOG_LINES = 25


@dataclass(frozen=True)
class TrialOptions:
    trials: int = 90
    seed: int | None = None
    kill_window_s: tuple[float, float] = (0.2, 4.0)
    victim_concurrency: int = 3
    survivor_concurrency: int = 6
    step_latency_ms: int = 400
    drain_timeout_s: float = 180.0
    # Celery's pool for the victims and the survivor (cluster.POOLS): under threads a kill
    # loses every run the victim's one process held at once.
    pool: str = "prefork"
    # The model endpoint's limits (its profile's `limits`) and the simulators' own (`POST
    # /sim/model/limit`): the trials under an endpoint held at its limit.
    limits: dict[str, int] | None = None
    sim_limit: dict[str, Any] | None = None


def _step(call_id: str, tool: str, latency: int, **args: Any) -> dict[str, Any]:
    return {"calls": [{"id": call_id, "tool": tool, "args": args}], "latency_ms": latency}


def trial_catalog(latency: int) -> dict[str, Any]:
    """The agents the trials run: every kind of write the judge counts duplicates of."""

    def agent(tools: list[str], steps: list[dict[str, Any]], answer: str) -> dict[str, Any]:
        steps = [*steps, {"final": answer, "latency_ms": latency}]
        return {"tools": tools, "model": {"provider": "scripted", "script": {"steps": steps}}}

    return {
        "agents": {
            "trial-webhook": agent(
                ["ticket.read", "incident.create", "issue.comment"],
                [
                    _step("toolu_tw_read", "ticket.read", latency, ticket="T-1"),
                    _step("toolu_tw_incident", "incident.create", latency, title="Trial outage"),
                    _step("toolu_tw_comment", "issue.comment", latency, issue="ENG-1", body="seen"),
                ],
                "Webhook handled.",
            ),
            TEAMS: agent(
                ["ticket.read"],
                [
                    _step("toolu_tt_read", "ticket.read", latency, ticket="T-2"),
                ],
                "Teams turn answered.",
            ),
            "trial-cron": agent(
                ["ticket.read", "issue.comment"],
                [
                    _step("toolu_tc_read", "ticket.read", latency, ticket="T-3"),
                    _step("toolu_tc_comment", "issue.comment", latency, issue="ENG-3", body="cron"),
                ],
                "Cron run done.",
            ),
        },
        "cron": [
            {"name": CRON_TRIGGER, "agent": "trial-cron", "input": "cron trial", "every_s": 3600}
        ],
    }


@dataclass
class TrialDeployment:
    """The processes and handles one trial session runs against."""

    settings: Settings
    seal_keys: str
    sealer: Sealer
    vendor_db_url: str
    log_dir: Path
    cluster: Cluster = field(init=False)
    victim_queue: str = field(init=False)
    front_url: str = field(init=False)
    bot_env: dict[str, str] = field(init=False, default_factory=dict)

    def start(self, options: TrialOptions) -> None:
        token = secrets.token_urlsafe(24)
        self.settings = replace(self.settings, front_token=token, tool_modules=sim_model.TOOLS)
        self.victim_queue = f"{self.settings.queue}.victims"
        self.cluster = Cluster(self.log_dir)
        sim_env = child_env(self.settings, self.seal_keys)
        vendor_url = self.cluster.simulator(self.vendor_db_url, sim_env)
        # The agents' model is the simulators' scripted model, served over HTTP: what it was
        # asked is in its own records.
        catalog = self.log_dir / "trial-agents.json"
        served = sim_model.served(vendor_url, trial_catalog(options.step_latency_ms))
        catalog.write_text(json.dumps(served))
        self.settings = replace(
            self.settings,
            vendor_url=vendor_url,
            agents_file=str(catalog),
            model_profiles=sim_model.profiles(vendor_url, options.limits),
        )
        if options.sim_limit is not None:
            sim_model.limit_model(vendor_url, options.sim_limit)
        # Teams turns come as Bot Framework activities, signed by a channel of our own whose
        # keys the front checks; replies go to the connector simulator (the serviceUrl), with
        # the bot's token from the simulators' token endpoint.
        self.channel = BotChannel().start()
        self.bot_env = self.channel.worker_env(vendor_url)
        survivor_env = {**child_env(self.settings, self.seal_keys), **self.bot_env}
        self.cluster.worker(
            "survivor",
            self.settings.queue,
            survivor_env,
            concurrency=options.survivor_concurrency,
            pool=options.pool,
        )
        self.cluster.beat(survivor_env)
        self.front_url = self.cluster.front({**self.starter_env(), **self.channel.env(TEAMS)})
        victims = replace(self.settings, queue=self.victim_queue)
        app = Celery("liyagent-trials", set_as_current=False)
        app.conf.update(celeryconfig.config_for(victims))
        self.services = runtime_services.build(
            victims,
            CeleryPublisher(app, self.victim_queue, victims.resumed_first),
            sealer=self.sealer,
        )
        self.http = httpx.Client(
            base_url=self.front_url, timeout=10, headers={"Authorization": f"Bearer {token}"}
        )

    def starter_env(self) -> dict[str, str]:
        """The front's: the runs it starts go to the victims' queue."""
        env = child_env(replace(self.settings, queue=self.victim_queue), self.seal_keys)
        return {**env, **self.bot_env}

    def victim_env(self) -> dict[str, str]:
        """A victim's: it consumes the victims' queue (`-Q`), and what it publishes itself
        goes to the deployment's run queue, the survivor's."""
        return {**child_env(self.settings, self.seal_keys), **self.bot_env}

    def stop(self) -> None:
        if hasattr(self, "channel"):
            self.channel.stop()
        if hasattr(self, "http"):
            self.http.close()
        if hasattr(self, "services"):
            self.services.redis.close()
        self.cluster.stop()


@dataclass
class TrialSession:
    deployment: TrialDeployment
    options: TrialOptions
    seed: int
    trials: list[Trial] = field(default_factory=list)
    victims: list[Victim] = field(default_factory=list)

    def round(self, index: int, rng: random.Random) -> None:
        """Start a victim, begin a cron fire, a Teams turn and a webhook call on it, kill it."""
        d = self.deployment
        if index % 2:
            self._settle()
        victim = d.cluster.worker(
            f"victim-{index}",
            d.victim_queue,
            d.victim_env(),
            concurrency=self.options.victim_concurrency,
            ops=False,
            pool=self.options.pool,
        )
        up, up_at = time.monotonic(), datetime.now(tz=UTC)
        delay = rng.uniform(*self.options.kill_window_s)
        if index % 2:
            self._lead(holder_of(victim.popen.pid))
        self._begin(index)
        time.sleep(max(0.0, up + delay - time.monotonic()))  # the seeded kill moment
        holders = frozenset(holder_of(pid) for pid in [victim.popen.pid, *victim.children()])
        led = death_watch_leader(d.services.redis, d.services.settings.namespace) in holders
        killed_at = datetime.now(tz=UTC)
        victim.kill()
        self.victims.append(Victim(up_at, killed_at, holders, led))
        log.info("trials.killed", round=index, delay_s=round(delay, 3), victim_led=led)

    def _settle(self, timeout_s: float = 5.0) -> None:
        """Before a round that hands the lead over, wait (bounded) until the watch has taken
        every killed victim's work: a hand-over restarts the grace count of a death the old
        leader was still counting, which a deployment sees only when its leader itself dies
        within a grace of another death, and would otherwise charge that delay to the round
        before this one."""
        dead = frozenset().union(*(v.holders for v in self.victims))
        deadline = time.monotonic() + timeout_s
        while dead & self.deployment.services.leases.holders_with_work():
            if time.monotonic() > deadline:
                log.warning("trials.not_settled", timeout_s=timeout_s)
                return
            time.sleep(0.05)

    def _lead(self, holder: str, timeout_s: float = 2.0) -> None:
        """Hand the death watch's lead to the victim's main process, once it has named its
        connections in Redis (just after its readiness line); a round where it never does
        just keeps its leader, and the kill records whoever led."""
        deadline = time.monotonic() + timeout_s
        while not hand_lead(
            self.deployment.services.redis, self.deployment.services.settings.namespace, holder
        ):
            if time.monotonic() > deadline:
                log.warning("trials.lead_not_handed", holder=holder)
                return
            time.sleep(0.02)

    def _begin(self, index: int) -> None:
        d, tag = self.deployment, f"{self.seed}-{index}"
        remaining = self.options.trials - len(self.trials)
        if remaining > 0:
            slot = CRON_BASE + timedelta(days=self.seed % 100_000, hours=index)
            fire_cron(d.services, CRON_TRIGGER, slot)
            self.trials.append(Trial("cron", CRON_TRIGGER, index, slot))
        if remaining > 1:
            # A personal chat: the bot's app is installed for the person who writes to it.
            d.channel.install_personal(d.settings.vendor_url, f"trial-conv-{tag}")
            activity = d.channel.activity(
                activity_id=f"trial-{tag}",
                conversation=f"trial-conv-{tag}",
                text="status?",
                service_url=d.settings.vendor_url,
            )
            d.channel.post(d.http, activity).raise_for_status()
            self.trials.append(Trial("teams", f"trial-{tag}", index))
        if remaining > 2:
            response = d.http.post(
                "/webhooks/trial-webhook", json={"event_id": f"evt-{tag}", "input": "outage report"}
            )
            response.raise_for_status()
            self.trials.append(Trial("webhook", f"webhook:trial-webhook:evt-{tag}", index))

    def drain(self) -> None:
        """Wait (bounded) until every trial's record has reached its end."""
        from liyagent.local.verdict import trial_end

        deadline = time.monotonic() + self.options.drain_timeout_s
        engine = self.deployment.services.engine
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if all(trial_end(conn, t).ended for t in self.trials):
                    return
            time.sleep(0.5)
        log.warning("trials.drain_timeout", timeout_s=self.options.drain_timeout_s)
        self.say_stuck()

    def say_stuck(self) -> None:
        """After a drain that timed out, what was left (printed, for the failure's reader): the
        trials not ended and where their runs stand, every run of the deployment that has not
        ended by status and wait, and the last lines of each process's log."""
        from liyagent.local.verdict import trial_end

        engine = self.deployment.services.engine
        with engine.connect() as conn:
            for trial in self.trials:
                end = trial_end(conn, trial)
                if not end.ended:
                    log.warning("trials.not_ended", kind=trial.kind, ref=trial.ref, run=end.run_id)
            rows = conn.execute(sa.text(STUCK_SQL)).all()
        for row in rows:
            log.warning("trials.run_not_ended", **row._asdict())
        for path in sorted(self.deployment.log_dir.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-STUCK_LOG_LINES:]
            log.warning("trials.log_tail", log=path.name, lines="\n".join(lines))


def run_trials(
    deployment: TrialDeployment,
    options: TrialOptions,
    on_round: Callable[[int, int], None] | None = None,
) -> Verdict:
    """Run the rounds, drain, and judge every trial from the database."""
    seed = options.seed if options.seed is not None else secrets.randbelow(2**31)
    rng = random.Random(seed)
    session = TrialSession(deployment, options, seed)
    rounds = -(-options.trials // 3)
    for index in range(rounds):
        session.round(index, rng)
        if on_round is not None:
            on_round(index + 1, rounds)
    session.drain()
    vendor = sa.create_engine(deployment.vendor_db_url, hide_parameters=True)
    try:
        return judge_trials(
            deployment.services.engine,
            vendor,
            session.trials,
            session.victims,
            seed,
            pool=options.pool,
        )
    finally:
        vendor.dispose()
