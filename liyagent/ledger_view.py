"""How the ledger is shown to a person (issue 34): a run's usage rows and totals in `liyagent
inspect`, and the usage report of `liyagent usage`. Exact usage (written steps, counted once)
and unconfirmed usage (a lost attempt's reservation for a step it never wrote: an upper bound
of what its lost request was billed) are always shown apart."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from store.ledger import LedgerEntry, UsageLine
from store.usage import UsageTotals


def usd(value: Decimal | None) -> str:
    """Dollars for a person: up to a millionth of a cent shown, `?` when unpriced."""
    if value is None:
        return "?"
    return f"${value:.6f}"


def render_totals(out: Console, used: UsageTotals) -> None:
    """A run's totals: exact, unconfirmed, and with its children's."""
    out.print(
        Text(
            f"Usage: {used.input_tokens} input tokens ({used.cached_tokens} cached), "
            f"{used.output_tokens} output, {usd(used.cost_usd)}; unconfirmed (lost "
            f"attempts' reservations): {used.unconfirmed_input_tokens} input, "
            f"{used.unconfirmed_output_tokens} output, {usd(used.unconfirmed_cost_usd)}"
            + (f"; {used.unpriced} rows of unpriced models" if used.unpriced else "")
        )
    )
    every = used.with_children
    if every is not None and every != _own(used):
        out.print(
            Text(
                f"With its child runs: {every.input_tokens} input, {every.output_tokens} "
                f"output, {usd(every.cost_usd)}; unconfirmed {every.unconfirmed_input_tokens} "
                f"input, {every.unconfirmed_output_tokens} output"
            )
        )


def _own(used: UsageTotals) -> UsageTotals:
    """The totals without their `with_children` (to tell whether children add anything)."""
    return UsageTotals(
        used.input_tokens, used.output_tokens, used.cached_tokens,
        used.unconfirmed_input_tokens, used.unconfirmed_output_tokens,
        used.cost_usd, used.unconfirmed_cost_usd, used.unpriced,
    )  # fmt: skip


def render_entries(out: Console, entries: Sequence[LedgerEntry]) -> None:
    """A run's usage rows, by step."""
    if not entries:
        return
    table = Table("step", "attempt", "kind", "input", "cached", "output", "model", "cost")
    for e in entries:
        table.add_row(
            str(e.step),
            "" if e.attempt is None else str(e.attempt),
            "unconfirmed" if e.unconfirmed else "exact",
            _n(e.input_tokens),
            _n(e.cached_tokens),
            _n(e.output_tokens),
            e.model or "",
            usd(e.cost_usd),
        )
    out.print(table)


def render_report(out: Console, by: str, lines: Sequence[UsageLine], since: str) -> None:
    """The usage report, a line per group."""
    out.print(Text(f"Usage since {since} by {by} (unconfirmed: lost attempts' reservations)"))
    table = Table(
        by, "runs", "input", "cached", "output", "cost", "unconf. input", "unconf. output",
        "unconf. cost", "unpriced",
    )  # fmt: skip
    for line in lines:
        table.add_row(
            line.key, str(line.runs), str(line.input_tokens), str(line.cached_tokens),
            str(line.output_tokens), usd(line.cost_usd), str(line.unconfirmed_input_tokens),
            str(line.unconfirmed_output_tokens), usd(line.unconfirmed_cost_usd),
            str(line.unpriced),
        )  # fmt: skip
    out.print(table)


def _n(value: int | None) -> str:
    return "" if value is None else str(value)
