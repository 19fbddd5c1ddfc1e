"""The ledger judged from the model server's bills for one finished run (its own records,
`sim.requests`): every billed request but the last of its step (the one the written step came
from: no step is asked again once written, I5) belongs to a lost attempt, and is covered by the
unconfirmed usage its claim recorded for that attempt and step."""

from __future__ import annotations

from tests.support.stack import Stack


def uncovered(stack: Stack, run_id: str) -> list[str]:
    """The billed requests of lost attempts that unconfirmed usage does not cover (none when the
    ledger holds)."""
    billed = stack.vendor(
        "SELECT attempt, call, prompt_tokens, completion_tokens FROM sim.requests "
        "WHERE vendor = 'model' AND run_id = :r AND status = 200 ORDER BY id",
        r=run_id,
    )
    last = {int(b.call): (int(b.attempt), int(b.call)) for b in billed}
    noted = {
        (u.attempt, u.step): (u.input_tokens, u.output_tokens)
        for u in stack.rows(
            "SELECT attempt, step, input_tokens, output_tokens FROM usage_unconfirmed "
            "WHERE run_id = :r",
            r=run_id,
        )
    }
    problems = []
    for b in billed:
        key = (int(b.attempt), int(b.call))
        if last[key[1]] == key:
            continue
        found = noted.get(key)
        if found is None or found[0] < b.prompt_tokens or found[1] < b.completion_tokens:
            problems.append(
                f"attempt {key[0]} step {key[1]}: billed "
                f"({b.prompt_tokens}, {b.completion_tokens}), unconfirmed {found}"
            )
    return problems
