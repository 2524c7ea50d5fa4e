"""Validation inside training: the best version on tasks the training never samples, kept.

Every `every` iterations (and after the last) the policy, as it serves, runs each validation
task once, greedily, through the same rollout and recording as training (the probe's held-out
check, under the run id '<run>-val-<iteration>'). The score is the success rate; a version is
better than the best so far when `core.types.prefers` says so (it beats it by more than
`margin`), the one rule the promotion gate uses too (it refuses a candidate the serving version
beats by more than its margin). The start is scored first, so the best is never
below where training started. After `patience` evaluations without a gain the training stops,
and when it ends the live policy serves the best version: a rollback where the policy still
holds it, else its adapter folder loaded again under the name '<version>-best'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from forge_bridge.core.types import prefers
from forge_bridge.trainer.settings import check, count, number


@dataclass(frozen=True)
class Validation:
    """What validation inside training runs, and how it decides."""

    tasks: tuple = ()
    """The validation tasks (each run once, greedily)."""
    every: int = 1
    """Evaluate after every this many iterations (and after the last)."""
    patience: int | None = None
    """Stop after this many evaluations in a row without a gain (None: never stop early)."""
    margin: float = 0.0
    """A gain is a success rate above the best by more than this (`core.types.prefers`)."""
    kind_key: str = "kind"
    """The task field that names its kind, for the per-kind success (a task without one is 'all')."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        check(len(self.tasks) > 0, "validation", "at least one task", self.tasks)
        check(count(self.every, 1), "eval_every", "an int >= 1", self.every)
        check(self.patience is None or count(self.patience, 1), "patience", "an int >= 1 or None", self.patience)
        check(number(self.margin) and math.isfinite(self.margin) and self.margin >= 0, "margin",
              "a finite number >= 0", self.margin)

    def due(self, iteration: int, last: int) -> bool:
        """Whether iteration `iteration` (1-based, done) is evaluated."""
        return iteration % self.every == 0 or iteration == last


@dataclass
class Best:
    """The validation scores so far and the best of them."""

    scores: dict[int, float] = field(default_factory=dict)
    """Iteration -> success rate (the start's under the iteration training started from)."""
    served: dict[int, dict[str, str | None]] = field(default_factory=dict)
    """Iteration -> the version each slot served when it was scored."""
    best: int | None = None
    """The iteration whose versions scored best (ties: the earlier)."""
    without_gain: int = 0
    """Evaluations in a row since the last gain."""

    def observe(self, iteration: int, score: float, served: dict[str, str | None], margin: float) -> bool:
        """Record a score; True when it is a gain (the first score always is)."""
        self.scores[iteration], self.served[iteration] = score, dict(served)
        if self.best is None or prefers(score, self.scores[self.best], margin):
            self.best, self.without_gain = iteration, 0
            return True
        self.without_gain += 1
        return False

    def out_of_patience(self, patience: int | None) -> bool:
        return patience is not None and self.without_gain >= patience

    def state(self) -> dict:
        """For the checkpoint (a resumed run goes on with the same best)."""
        return {"scores": {str(k): v for k, v in self.scores.items()},
                "served": {str(k): v for k, v in self.served.items()}, "best": self.best,
                "without_gain": self.without_gain}

    @classmethod
    def from_state(cls, state: dict) -> "Best":
        return cls({int(k): v for k, v in state["scores"].items()}, {int(k): v for k, v in state["served"].items()},
                   state["best"], state["without_gain"])


def serve_best(policy: Any, best: Best, folder_of: Any) -> dict[str, str | None]:
    """Make each slot serve the version it served at the best iteration; returns slot -> the
    version served now. `folder_of(version)`: that version's adapter folder, or None."""
    assert best.best is not None
    now = {}
    for slot, version in best.served[best.best].items():
        if policy.current(slot) != version and version in policy.versions(slot):
            while policy.current(slot) != version:
                policy.rollback(slot)
        elif policy.current(slot) != version:
            path = folder_of(version)
            if path is None:
                raise FileNotFoundError(f"the best version on validation, {version!r}, is no longer held by the "
                                        "policy and has no adapter folder in this run")
            again = f"{version}-best"
            if again in policy.versions(slot):  # loaded again by an earlier run on this policy, and still held
                while policy.current(slot) != again:
                    policy.rollback(slot)
            else:
                policy.load_adapter(path, again, slot=slot)
        now[slot] = policy.current(slot)
    return now




@dataclass
class Validating:
    """A training run's validation while it runs: the rollout, what to run, the scores."""

    rollout: Any
    spec: Validation
    best: Best
    last: int
    """The run's last iteration (always evaluated)."""


__all__ = ["Best", "Validating", "Validation", "serve_best"]
