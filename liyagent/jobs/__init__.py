"""The built-in job kinds, declared with `@job` as any team declares its own: a source sync and
a fine-tuning job (resumable), classifier training and a red-team run (not resumable).

Every process loads them through `LIYAGENT_JOB_MODULES` (default `liyagent.jobs`); the engine
(runtime/core/jobs.py) knows none of them by name.
"""

from __future__ import annotations

from liyagent.jobs.classifier_training import ClassifierParams, classifier_training
from liyagent.jobs.fine_tune import FineTuneParams, fine_tune
from liyagent.jobs.red_team import RedTeamParams, red_team
from liyagent.jobs.source_sync import SourceSyncParams, source_sync
from runtime.toolbox.job_kinds import JobKind

KINDS: dict[str, JobKind] = {
    k.name: k for k in (source_sync, fine_tune, classifier_training, red_team)
}

__all__ = [
    "KINDS",
    "ClassifierParams",
    "FineTuneParams",
    "RedTeamParams",
    "SourceSyncParams",
    "classifier_training",
    "fine_tune",
    "red_team",
    "source_sync",
]
