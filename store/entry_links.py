"""What a new run is linked to (its entry's own row), made by the entry kind's store module
(`store/a2a.py`, `store/cron.py`, `store/teams.py`) and inserted in the run's own statement
(`store.runs.insert_run`), so a run and its link exist together or not at all."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class EntryLink:
    """A CTE linking the run the `r` CTE inserted to its entry's row (an A2A task, a cron
    record, an inbox row), with its parameters (each named `link_*`)."""

    kind: str
    sql: str
    params: dict[str, Any] = field(default_factory=dict)

    def cte(self) -> tuple[str, dict[str, Any]]:
        """The CTE (`link AS (...)`) and its parameters."""
        return self.sql, self.params


class EntryEnd(Protocol):
    """An entry kind's CTE landing a run's end on its row, in the ending statement itself:
    `source` is the CTE of the runs that ended, `outcome_sql` their answer or failure reason,
    `where` a further condition on them; the answer's `:reply` parameter is the statement's."""

    def __call__(self, source: str, *, success: bool, outcome_sql: str, where: str) -> str: ...
