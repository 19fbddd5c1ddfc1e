"""A model step's usage as the store keeps it: columns on the row the step is written in (a step
record, or the run's row for the final answer), set by the statement that writes the step, so
the ledger costs no statement of its own and only a written step is counted (I5)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

# The columns, in order; `usage_columns(prefix)` declares them, `usage_params` binds them.
NAMES = ("input_tokens", "output_tokens", "cached_tokens", "model", "cost_usd")


@dataclass(frozen=True)
class StepUsage:
    """The tokens one model response reported: every input token billed (`cached_tokens` of
    them read from the prompt cache), the tokens generated, the model it names, and what they
    cost at the deployment's prices when written (None: no price for the model)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    model: str | None = None
    cost_usd: Decimal | None = None


@dataclass(frozen=True)
class UsageTotals:
    """A run's usage: its written steps' exact usage summed (a step whose provider reported
    none adds nothing), what its lost attempts were reserved for steps they never wrote
    (`unconfirmed_*`, store/ledger.py: an upper bound, kept apart), and their cost at the
    prices in force when each was recorded (`unpriced` rows name a model no price covers: their
    tokens are counted, their cost is not in `cost_usd`). `with_children` is the same over the
    run and every run it delegated to, at any depth (None where not read)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    unconfirmed_input_tokens: int = 0
    unconfirmed_output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    unconfirmed_cost_usd: Decimal = Decimal(0)
    unpriced: int = 0
    with_children: UsageTotals | None = None

    def to_json(self) -> dict[str, Any]:
        """As JSON: tokens as numbers, dollars as decimal strings (exact)."""
        out: dict[str, Any] = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "unconfirmed_input_tokens": self.unconfirmed_input_tokens,
            "unconfirmed_output_tokens": self.unconfirmed_output_tokens,
            "cost_usd": f"{self.cost_usd:f}",
            "unconfirmed_cost_usd": f"{self.unconfirmed_cost_usd:f}",
            "unpriced": self.unpriced,
        }
        if self.with_children is not None:
            out["with_children"] = self.with_children.to_json()
        return out


def usage_columns(prefix: str = "") -> list[sa.Column[Any]]:
    """The usage columns of a row a step is written in (nullable: a provider may say none)."""
    return [
        sa.Column(f"{prefix}input_tokens", sa.Integer, nullable=True),
        sa.Column(f"{prefix}output_tokens", sa.Integer, nullable=True),
        sa.Column(f"{prefix}cached_tokens", sa.Integer, nullable=True),
        sa.Column(f"{prefix}model", sa.Text, nullable=True),
        sa.Column(f"{prefix}cost_usd", sa.Numeric(18, 9), nullable=True),
    ]


def usage_params(usage: StepUsage | None) -> dict[str, Any]:
    """The bind parameters `:input_tokens, :output_tokens, :cached_tokens, :model, :cost_usd`
    of a statement that writes a step (all None when its provider reported no usage)."""
    if usage is None:
        return dict.fromkeys(NAMES)
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cached_tokens": usage.cached_tokens,
        "model": usage.model,
        "cost_usd": usage.cost_usd,
    }


# Every usage row of one run `tree.id`: its written steps' (exact), its final answer's
# (exact), and its lost attempts' reservations (unconfirmed).
_ROWS = """
        SELECT false AS unconfirmed, input_tokens AS i, output_tokens AS o, cached_tokens AS c,
               cost_usd AS usd, model IS NOT NULL AND cost_usd IS NULL AS unpriced
        FROM run_steps WHERE run_id = tree.id
        UNION ALL
        SELECT false, answer_input_tokens, answer_output_tokens, answer_cached_tokens,
               answer_cost_usd, answer_model IS NOT NULL AND answer_cost_usd IS NULL
        FROM runs WHERE id = tree.id
        UNION ALL
        SELECT true, input_tokens, output_tokens, 0, cost_usd, cost_usd IS NULL
        FROM usage_unconfirmed WHERE run_id = tree.id"""

# The sums `UsageTotals` holds, each over the run alone (`own`) and with its children.
_SUMS = {
    "input": "i) FILTER (WHERE NOT x.unconfirmed",
    "output": "o) FILTER (WHERE NOT x.unconfirmed",
    "cached": "c) FILTER (WHERE NOT x.unconfirmed",
    "u_input": "i) FILTER (WHERE x.unconfirmed",
    "u_output": "o) FILTER (WHERE x.unconfirmed",
    "usd": "usd) FILTER (WHERE NOT x.unconfirmed",
    "u_usd": "usd) FILTER (WHERE x.unconfirmed",
    "unpriced": "unpriced::int) FILTER (WHERE true",
}


def _sum(name: str, own: bool) -> str:
    expr, where = _SUMS[name].split(") FILTER (WHERE ")
    mine = " AND tree.own" if own else ""
    return (
        f"coalesce(sum(x.{expr}) FILTER (WHERE {where}{mine}), 0) AS {'' if own else 'all_'}{name}"
    )


# The usage of the run `r` and of the runs it delegated to (any depth: `parent_run_id`), as
# columns `input`, `all_input`, ...: a lateral read in the statement that reads its row (no
# query of its own; the children by the partial index on parent_run_id).
TOTALS_SQL = f"""
    LEFT JOIN LATERAL (
        WITH RECURSIVE tree AS (
            SELECT r.id AS id, true AS own
            UNION ALL
            SELECT k.id, false FROM runs k JOIN tree ON k.parent_run_id = tree.id)
        SELECT {", ".join(_sum(n, own) for own in (True, False) for n in _SUMS)}
        FROM tree CROSS JOIN LATERAL ({_ROWS}) x) u ON TRUE"""
TOTALS_COLUMNS = ", ".join(f"u.{p}{n}" for p in ("", "all_") for n in _SUMS)


def _totals(row: sa.Row[Any], prefix: str) -> UsageTotals:
    def read(name: str) -> Any:
        return getattr(row, f"{prefix}{name}")

    return UsageTotals(
        input_tokens=int(read("input")),
        output_tokens=int(read("output")),
        cached_tokens=int(read("cached")),
        unconfirmed_input_tokens=int(read("u_input")),
        unconfirmed_output_tokens=int(read("u_output")),
        cost_usd=Decimal(read("usd")),
        unconfirmed_cost_usd=Decimal(read("u_usd")),
        unpriced=int(read("unpriced")),
    )


def totals_of(row: sa.Row[Any]) -> UsageTotals:
    """The totals `TOTALS_COLUMNS` read: the run's own, with those of its children."""
    return replace(_totals(row, ""), with_children=_totals(row, "all_"))
