"""How one delivery of a run's message ended: what its Celery task returns (Flower shows it)."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """The end of one attempt's task, as its task result (a string in Celery's backend)."""

    SUCCEEDED = "succeeded"  # the run ended with its answer handed on
    FAILED = "failed"  # the run failed with a reason (told and audited)
    WAITING = "waiting"  # the run suspended on an approval or a child run
    HANDED_BACK = "handed_back"  # given back as a new attempt: a warm shutdown, or a yield
    ANSWER_HANDED_ON = "answer_handed_on"  # a resume handed an answer stored before on
    STORE_FAULT = "store_fault"  # Postgres went away; the run was given back once it answered
    FENCED = "fenced"  # another attempt owns the run: this one wrote nothing more (I3)
    LEASE_TAKEN = "lease_taken"  # the run's lease is held by another attempt: message requeued
    STALE = "stale"  # the message's attempt is no longer the run's: nothing done
    POISON = "poison"  # delivered too often, its workers dying before starting it: failed
    ERROR = "error"  # a bug: kept as a crash, so the run resumes from its checkpoint elsewhere
