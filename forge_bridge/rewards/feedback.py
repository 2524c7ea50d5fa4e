"""Delayed feedback: `feedback(...)` records a judgement of an episode whenever it arrives (the
gateway's `POST /episodes/<id>/feedback` does the same over HTTP), and `feedback_reward` says
what the episode's reward is made of its events.

The rule, fixed and documented: for each key (`user`, `reviewer`, `judge`, ...) the latest event
counts (a user who changes their mind overrides themselves); the keys' latest values are then
combined by the caller's `combine` (default: their mean). An episode without feedback has no
reward (None), never 0: it is left out of training, not trained as a failure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Mapping

from forge_bridge.core.errors import NotFound, WrongType
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import Feedback

Combine = Callable[[Mapping[str, float]], "float | None"]
"""The keys' latest values -> the reward (e.g. `lambda v: v.get("reviewer", v.get("user"))`);
None: no reward yet (the key it reads has not arrived), so the episode is left out, not a 0."""


def latest_by_key(events: Iterable[Feedback]) -> dict[str, Feedback]:
    """key -> its latest event (by the store's arrival order, else the order given)."""
    out: dict[str, Feedback] = {}
    for _, event in sorted(enumerate(events), key=lambda pair: (pair[1].seq is None, pair[1].seq or 0, pair[0])):
        out[event.key] = event
    return out


def mean(values: Mapping[str, float]) -> float:
    """The keys' values averaged, each key once."""
    return sum(values.values()) / len(values)


def feedback_reward(events: Iterable[Feedback], combine: Combine = mean) -> float | None:
    """An episode's reward from its feedback: the latest value per key, then `combine`; None
    when there is no feedback."""
    latest = {key: event.value for key, event in latest_by_key(events).items()}
    value = combine(latest) if latest else None
    return None if value is None else float(value)


def feedback(episode_id: str, value: float, *, key: str = "user", comment: str | None = None,
             step: int | None = None, store: TrajectoryStore | str | os.PathLike | None = None,
             source: str = "api") -> Feedback:
    """Record a judgement of a stored episode (any time after it ended); returns the stored event.
    `store`: a store or its path (None: the default store, `FORGE_BRIDGE_STORE` or
    runs/trajectories.db). An episode the store does not hold (or no store at the path) is
    `NotFound`; a bad value is a `SchemaError`; either way nothing is written."""
    from forge_bridge.core.episode import default_store_path

    event = Feedback(episode_id=episode_id, value=value, key=key, comment=comment, step=step, source=source)
    if isinstance(store, TrajectoryStore):
        return store.add_feedback(event)
    if store is not None and not isinstance(store, (str, os.PathLike)):
        raise WrongType(f"store: expected a TrajectoryStore or a path, got {type(store).__name__}")
    path = Path(store if store is not None else default_store_path())
    if not path.is_file():
        raise NotFound(f"no trajectory store at {path}: feedback is kept beside the episodes it judges")
    with TrajectoryStore(path) as opened:
        return opened.add_feedback(event)


__all__ = ["Combine", "feedback", "feedback_reward", "latest_by_key", "mean"]
