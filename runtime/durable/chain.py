"""A run's checkpoints as a chain: the base (its whole state, on the run's row) and one sealed
record per step after it holding only what that step added.

Each record is sealed with the run id, its step and the digest of the record before it bound in
(I6): a record removed, reordered, moved from another run or replaced by an older one does not
verify, and neither does a chain that stops short of the run's step. A run checkpointed before
step records existed has its whole latest state as its base, at the run's step, and its later
records continue from it.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.base.sealing import Sealer, SealError, digest
from runtime.durable.state import RunState
from store.checkpoints import StepRecord
from store.rows import RunRow

BASE = "checkpoint"
RECORD = "step"


def rebuild(sealer: Sealer, run: RunRow, records: Sequence[StepRecord]) -> RunState:
    """The run's state at its step, from its base and step records (in step order), each
    verified against its seal and its place in the chain; SealError when any does not verify
    (ValueError when a verified payload has a shape this code cannot read; NewerFormat when
    newer code wrote it: runtime/durable/formats.py)."""
    assert run.checkpoint is not None
    base_step = records[0].step - 1 if records else run.step
    state = RunState.from_payload(sealer.open(run.id, BASE, base_step, run.checkpoint), run.id)
    if state.step != base_step:
        raise SealError(run.id, BASE, f"it holds step {state.step}, not {base_step}")
    prev = digest(run.checkpoint)
    for record in records:
        if record.step != state.step + 1:
            raise SealError(
                run.id, f"record of step {record.step}", f"the chain expects step {state.step + 1}"
            )
        state.apply(sealer.open(run.id, RECORD, record.step, record.sealed, chain=prev), run.id)
        if state.step != record.step:
            raise SealError(run.id, f"record of step {record.step}", "it names another step")
        prev = digest(record.sealed)
    if state.step != run.step:
        raise SealError(
            run.id, "step records", f"the chain ends at step {state.step}, the run is at {run.step}"
        )
    state.mark_written(prev)
    return state


def seal_step(sealer: Sealer, run_id: str, state: RunState) -> bytes:
    """The sealed record of the state's current step: what it added since the last record,
    chained to that record."""
    assert state.written is not None
    return sealer.seal(run_id, RECORD, state.step, state.delta(), chain=state.written.digest)
