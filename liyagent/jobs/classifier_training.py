"""`classifier_training`: train a multinomial naive Bayes text classifier in batches and report
how well it fits (not resumable: lost, it fails `interrupted` and is started again).

The trained model is returned in the job's answer (its priors and each label's most telling
tokens) with its accuracy on the examples, and optionally on held-out ones; it is not served.
"""

from __future__ import annotations

import math
from collections import Counter

from pydantic import Field

from runtime.base import faults
from runtime.toolbox.job_kinds import JobContext, JobParams, job


class Example(JobParams):
    text: str
    label: str = Field(min_length=1)


class ClassifierParams(JobParams):
    examples: list[Example] = Field(min_length=1)
    batch_size: int = Field(10, ge=1)
    # Examples kept out of training, to measure the model on what it has not seen.
    holdout: list[Example] = Field(default_factory=list)


def _tokens(text: str) -> list[str]:
    return text.lower().split()


class NaiveBayes:
    """Multinomial naive Bayes with add-one (Laplace) smoothing."""

    def __init__(self) -> None:
        self.priors: Counter[str] = Counter()
        self.words: dict[str, Counter[str]] = {}

    def learn(self, example: Example) -> None:
        self.priors[example.label] += 1
        self.words.setdefault(example.label, Counter()).update(_tokens(example.text))

    def predict(self, text: str) -> str:
        vocabulary = {w for counts in self.words.values() for w in counts}
        total = sum(self.priors.values())

        def score(label: str) -> float:
            counts = self.words[label]
            size = sum(counts.values()) + len(vocabulary)
            return math.log(self.priors[label] / total) + sum(
                math.log((counts[w] + 1) / size) for w in _tokens(text) if w in vocabulary
            )

        return max(sorted(self.priors), key=score)

    def accuracy(self, examples: list[Example]) -> float | None:
        if not examples:
            return None
        right = sum(self.predict(e.text) == e.label for e in examples)
        return round(right / len(examples), 4)


@job(kind="classifier_training")
def classifier_training(ctx: JobContext, params: ClassifierParams) -> dict[str, object]:
    """Train a multinomial naive Bayes text classifier in batches (not resumable)."""
    model = NaiveBayes()
    examples, batch = params.examples, params.batch_size
    for start in range(0, len(examples), batch):
        ctx.boundary()
        faults.point("in_job_batch")
        for example in examples[start : start + batch]:
            model.learn(example)
    top = {
        label: sorted(words, key=lambda w: -words[w])[:5] for label, words in model.words.items()
    }
    return {
        "labels": dict(model.priors),
        "top_tokens": top,
        "training_accuracy": model.accuracy(examples),
        "holdout_accuracy": model.accuracy(params.holdout),
    }
