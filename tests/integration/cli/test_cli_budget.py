"""`liyagent budget` and what `status`/`inspect` say of a run waiting on its budget, through
the real command against a per-test deployment (issue 34, item 4)."""

from __future__ import annotations

import json

from tests.integration.cli.test_cli import cli
from tests.support.scripts import mixed


def _start(stack, budget: dict[str, int]) -> str:
    steps = mixed("b")
    return stack.client.start_run(
        agent="support-bot",
        model={**stack.model(steps), "max_tokens": 40},
        user_input="help",
        tools=[c["tool"] for s in steps for c in s.get("calls") or []],
        budget=budget,
    )


def test_a_run_waiting_on_its_budget_is_said_and_raised_from_the_command_line(stack) -> None:
    stack.worker("w1")
    run_id = _start(stack, {"tokens": 5})
    view = stack.client.wait(run_id, timeout_s=30, until=frozenset({"waiting", "failed"}))
    assert view.status == "waiting"
    for command in ("status", "inspect"):
        said = cli(command, run_id, env=stack.env)
        assert said.returncode == 0, said.stderr
        assert "Waiting for: budget of this run" in said.stdout, said.stdout
    shown = cli("status", run_id, "--json", env=stack.env)
    assert json.loads(shown.stdout)["waiting_for"] == {"reason": "budget", "scope": "run"}
    bad = cli("budget", "raise", run_id, "--tokens", "-1", env=stack.env)
    assert bad.returncode == 2 and "tokens" in bad.stderr, bad
    raised = cli("budget", "raise", run_id[:8], "--tokens", "100000", "--json", env=stack.env)
    assert raised.returncode == 0, raised.stderr
    assert json.loads(raised.stdout) == {"run_id": run_id, "woken": True}
    assert stack.wait(run_id).status == "succeeded"


def test_an_agents_budget_is_set_and_listed(stack) -> None:
    done = cli(
        "budget", "set", "--agent", "support-bot", "--period", "day", "--tokens", "500",
        "--usd", "2.5", "--json", env=stack.env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["woken"] == []
    listed = cli("budget", "list", "--json", env=stack.env)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["scope"], row["name"], row["period"], row["tokens"]) == (
        "agent", "support-bot", "day", 500,
    )  # fmt: skip
    assert row["usd"] == "2.500000000" and row["spent_tokens"] == 0
    bad = cli("budget", "set", "--tenant", "t", "--period", "day", "--usd", "lots", env=stack.env)
    assert bad.returncode == 2 and "usd" in bad.stderr, bad
    assert stack.rows("SELECT count(*) AS n FROM budgets")[0].n == 1


def test_setting_one_amount_keeps_the_other_and_lift_removes_it(stack) -> None:
    def budget(*args: str) -> dict[str, object]:
        done = cli(
            "budget", "set", "--agent", "a", "--period", "month", *args, "--json", env=stack.env
        )
        assert done.returncode == 0, done.stderr
        (row,) = json.loads(cli("budget", "list", "--json", env=stack.env).stdout)
        return {"tokens": row["tokens"], "usd": row["usd"]}

    assert budget("--tokens", "500", "--usd", "2") == {"tokens": 500, "usd": "2.000000000"}
    assert budget("--tokens", "900") == {"tokens": 900, "usd": "2.000000000"}
    assert budget("--usd", "3") == {"tokens": 900, "usd": "3.000000000"}
    assert budget("--lift", "usd") == {"tokens": 900, "usd": None}
    both = cli(
        "budget", "set", "--agent", "a", "--period", "month", "--tokens", "1", "--lift",
        "tokens", env=stack.env,
    )  # fmt: skip
    assert both.returncode == 2 and "both set and lifted" in both.stderr, both
    none = cli("budget", "set", "--agent", "a", "--period", "month", env=stack.env)
    assert none.returncode == 2 and "neither tokens nor usd" in none.stderr, none
