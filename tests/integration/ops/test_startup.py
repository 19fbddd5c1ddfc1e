"""A process that would fail every task refuses to start, saying what to fix with the exit code
the CLI gives for the same problem; what a worker says once at its start (a queue it does not
consume, a development seal key) it says once, not once per process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest
import sqlalchemy as sa

from liyagent.local.procs import ROOT
from liyagent.local.servers import free_port
from runtime import services as runtime_services
from runtime.base.sealing import parse_keys
from runtime.entries.client import Client
from store.admin import create_database, drop_database
from tasks.services import CeleryPublisher
from tests.support.scripts import mixed

SEAL_MESSAGE = "LIYAGENT_SEAL_KEYS is not set and LIYAGENT_ENV=production"


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _env(stack, **changes: str) -> dict[str, str]:
    env = {**stack.env, **changes}
    return {k: v for k, v in env.items() if v != ""}


@pytest.mark.parametrize(
    "argv",
    [["celery", "-A", "tasks", "worker", "-c", "1"], ["celery", "-A", "tasks", "beat"]],
    ids=["worker", "beat"],
)
def test_production_without_seal_keys_refuses_to_start(stack, argv) -> None:
    done = _run(argv, _env(stack, LIYAGENT_ENV="production", LIYAGENT_SEAL_KEYS=""))
    assert done.returncode == 2
    assert SEAL_MESSAGE in done.stderr and "liyagent keys new" in done.stderr
    cli = _run(
        ["liyagent", "status"], _env(stack, LIYAGENT_ENV="production", LIYAGENT_SEAL_KEYS="")
    )
    assert cli.returncode == 2 and SEAL_MESSAGE in cli.stderr  # the same message as the CLI


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        ("lyt_no_such_module", "module lyt_no_such_module failed to import"),
        ("json", "module json declares no tools, agents, job kinds or workflows"),
    ],
)
def test_a_tool_module_that_does_not_load_stops_the_worker(stack, tools, says) -> None:
    done = _run(["celery", "-A", "tasks", "worker", "-c", "1"], _env(stack, LIYAGENT_TOOLS=tools))
    assert done.returncode == 2 and says in done.stderr
    assert "Traceback" not in done.stderr


def _cli_error(stack, env: dict[str, str]) -> tuple[int, str]:
    """What `liyagent status` exits with and prints for this environment's database."""
    cli = _run(["liyagent", "status"], env)
    assert cli.stderr.startswith("liyagent: error: "), cli.stderr
    return cli.returncode, cli.stderr.removeprefix("liyagent: error: ").strip()


@pytest.mark.parametrize(
    ("where", "exit_code", "says"),
    [
        ("missing database", 3, "cannot use Postgres at"),
        ("closed port", 3, "cannot use Postgres at"),
        ("database never migrated", 1, "run `liyagent db upgrade`"),
    ],
)
def test_a_worker_whose_database_cannot_be_used_refuses_to_start_as_the_cli_does(
    stack, servers, where, exit_code, says
) -> None:
    url = sa.make_url(stack.settings.database_url).set(password="pw-s3cret")
    if where == "missing database":
        url = url.set(database="lyt_no_such_database")
    elif where == "closed port":
        url = url.set(port=free_port())
    else:
        url = url.set(database=f"lyt_empty_{uuid.uuid4().hex[:12]}")
        create_database(servers[0], str(url.database))
    env = _env(stack, LIYAGENT_DATABASE_URL=url.render_as_string(hide_password=False))
    try:
        _refused_as_the_cli_is(stack, env, exit_code, says)
    finally:
        if where == "database never migrated":
            drop_database(servers[0], str(url.database))


def _refused_as_the_cli_is(stack, env: dict[str, str], exit_code: int, says: str) -> None:
    code, message = _cli_error(stack, env)
    assert code == exit_code and says in message
    started = time.monotonic()
    done = _run(["celery", "-A", "tasks", "worker", "-c", "1"], env)
    assert time.monotonic() - started < 30  # at once, not after taking messages
    assert done.returncode == code
    assert f"liyagent worker does not start: {message}" in done.stderr
    assert "pw-s3cret" not in done.stderr and "Traceback" not in done.stderr
    assert "ready." not in done.stderr + done.stdout


def test_a_worker_under_gevent_refuses_to_start_naming_the_supported_pools(stack) -> None:
    pytest.importorskip("gevent")  # a dev dependency: without it Celery itself fails first
    done = _run(["celery", "-A", "tasks", "worker", "-P", "gevent", "-c", "2"], _env(stack))
    assert done.returncode == 2
    assert "liyagent worker does not start: the gevent pool is not supported" in done.stderr
    assert "-P prefork (the default), -P threads or -P solo" in done.stderr
    assert "ready." not in done.stderr + done.stdout


def test_a_worker_not_consuming_the_runs_queue_says_so_once_at_start(stack) -> None:
    q = stack.settings.queue
    # Its -Q names the deployment's queues, its LIYAGENT_QUEUE another: runs go there.
    astray = stack.worker("astray", env={"LIYAGENT_QUEUE": "elsewhere"})
    lines = [line for line in astray.output().splitlines() if "runs_queue_not_consumed" in line]
    assert len(lines) == 1
    assert f"consumes {q}, {q}.ops but not elsewhere" in lines[0]
    assert "LIYAGENT_QUEUE=elsewhere" in lines[0]
    for silent in (stack.worker("both"), stack.worker("ops", runs=False)):
        assert "runs_queue_not_consumed" not in silent.output()


def test_the_development_key_warning_is_given_once_across_a_worker_s_processes(
    stack, tmp_path
) -> None:
    dev_file = tmp_path / "dev-seal-keys"
    worker = stack.worker(
        "dev", env={"LIYAGENT_SEAL_KEYS": "", "LIYAGENT_DEV_SEAL_FILE": str(dev_file)}
    )
    # Runs sealed with the worker's development key, so its pool children build their services
    # (and open what the client sealed) and both of them take a run.
    services = runtime_services.build(
        stack.settings,
        CeleryPublisher(stack.app, stack.settings.queue),
        sealer=parse_keys(dev_file.read_text().strip()),
    )
    client = Client(services)
    run_ids = [
        client.start_run(agent="support-bot", model=stack.model(mixed(str(i))), user_input="help")
        for i in range(4)
    ]
    for run_id in run_ids:
        assert client.wait(run_id, timeout_s=60).status == "succeeded"
    services.redis.close()
    said = worker.output()
    assert len(worker.children()) == 2
    assert all(f"ForkPoolWorker-{n}] Task liyagent.run" in said for n in (1, 2)), said[-3000:]
    assert said.count("seal.dev_key_in_use") == 1


def test_the_development_key_warning_is_given_once_per_deployment_not_per_process(
    stack, tmp_path
) -> None:
    dev = {"LIYAGENT_SEAL_KEYS": "", "LIYAGENT_DEV_SEAL_FILE": str(tmp_path / "dev-seal-keys")}
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"steps": mixed("d")}))
    start = [
        "liyagent.cli.main", "run", "--agent", "support-bot", "--script", str(script),
        "--input", "help", "--json", "--tools",
        "ticket.read,incident.create,issue.comment,chat.reply",
    ]  # fmt: skip
    worker = stack.worker("dev", env=dev)
    assert worker.output().count("seal.dev_key_in_use") == 1
    # The deployment's next processes (here two CLI commands that seal) stay silent...
    for _ in range(2):
        said = _run(start, _env(stack, **dev))
        assert said.returncode == 0, said.stderr[-2000:]
        assert "seal.dev_key_in_use" not in said.stderr + said.stdout
    # ...while another deployment (its own namespace) using the same key file is told.
    elsewhere = _run(start, _env(stack, **dev, LIYAGENT_NAMESPACE=f"lyt:{uuid.uuid4().hex[:8]}:"))
    assert elsewhere.returncode == 0, elsewhere.stderr[-2000:]
    assert (elsewhere.stderr + elsewhere.stdout).count("seal.dev_key_in_use") == 1


KEY = "sk-live-0123456789abcdefLEAK"


def _module(tmp_path, name: str, body: str) -> dict[str, str]:
    """A team's tool module `name` on PYTHONPATH: the environment a worker loads it with."""
    (tmp_path / f"{name}.py").write_text(body)
    return {"PYTHONPATH": str(tmp_path), "LIYAGENT_TOOLS": f"liyagent.vendor_tools,{name}"}


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ('{"provider": "opnai", "model": "m"}', "agent typo-bot: model.provider 'opnai'"),
        (f'{{"provider": "openai", "model": "m", "api_key": "{KEY}"}}', "agent leaky-bot: "),
    ],
)
def test_an_agent_declared_wrong_stops_its_module_loading(stack, tmp_path, model, says) -> None:
    """A misspelled provider or an inline key fails when the agent is declared, so a worker
    that would refuse every one of its runs refuses to start instead, naming the agent."""
    name = says.split()[1].rstrip(":")
    env = {
        **_env(stack),
        **_module(
            tmp_path,
            "team_agents",
            f"from liyagent import agent\nbot = agent({name!r}, model={model})\n",
        ),
    }
    done = _run(["celery", "-A", "tasks", "worker", "-c", "1"], env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "liyagent worker does not start" in done.stderr and says in done.stderr
    assert KEY not in done.stderr + done.stdout and "Traceback" not in done.stderr


def test_a_worker_without_its_agents_key_says_so_once_at_start(stack, tmp_path) -> None:
    """An agent whose model's key is not in the worker's environment (or whose endpoint its
    deployment does not declare) would fail at its first step: the worker says so once when it
    starts, naming the agent and the variable, and still serves the other agents."""
    module = (
        "from liyagent import agent\n"
        'keyless = agent("keyless-bot", model={"provider": "anthropic", "model": "claude-x"})\n'
        'lost = agent("lost-bot", model={"profile": "nowhere", "model": "m"})\n'
    )
    env = {**_module(tmp_path, "team_agents", module), "ANTHROPIC_API_KEY": ""}
    worker = stack.worker("w1", env=env)
    said = [line for line in worker.output().splitlines() if "worker.agent_unusable" in line]
    assert len(said) == 2, said
    keyless = next(line for line in said if "keyless-bot" in line)
    assert "ANTHROPIC_API_KEY (api_key_env) is not set" in keyless
    lost = next(line for line in said if "lost-bot" in line)
    assert "model.profile is not a profile this deployment declares" in lost
    run_id = stack.start(mixed("k"))  # the other agents are served
    assert stack.wait(run_id).status == "succeeded"
