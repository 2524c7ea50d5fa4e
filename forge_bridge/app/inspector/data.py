"""What `forge-bridge inspect` shows, read from a run folder: the trajectory store (opened
read-only through `TrajectoryStore`, safe while a run is writing to it in WAL mode; every list is
the store's paged query), `metrics.jsonl`, `results.json` and the tokenizer the trainer saved
beside them. The inspector writes no SQL of its own: the store owns its data.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_bridge.core.errors import InvalidArgument, NotFound
from forge_bridge.core.store import TrajectoryQuery, TrajectoryStore
from forge_bridge.core.types import Trajectory, TrajectoryRow, Transition


@dataclass(frozen=True)
class Filters:
    """The trajectory table as the page's query string asks for it: the store's query and a page."""

    query: TrajectoryQuery = TrajectoryQuery()
    page: int = 1

    @classmethod
    def from_query(cls, query: dict[str, str]) -> "Filters":
        names = {f.name for f in dataclasses.fields(TrajectoryQuery)}
        try:
            page = max(1, int(query.get("page", "1")))
        except ValueError:
            raise InvalidArgument(f"page: expected a number, got {query.get('page')!r}") from None
        return cls(TrajectoryQuery(**{k: v for k, v in query.items() if k in names}), page)


@dataclass
class Step:
    """One model call as recorded, with what the trainer made of it."""

    index: int
    transition: Transition
    iteration: int | None = None
    advantage: float | None = None
    trained_tokens: int = 0
    teacher_logprobs: list[float] | None = None
    """The teacher's log-probability of each completion token (on-policy distillation; None: not scored)."""
    new_prompt_ids: list[int] = field(default_factory=list)
    """Prompt tokens not in the previous step's prompt + completion (tool results, template)."""


class RunView:
    """Read-only access to one run folder (or a bare store)."""

    def __init__(self, folder: str | Path | None = None, *, store: str | Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else None
        if store is None:
            if self.folder is None:
                raise InvalidArgument("inspect: give a run folder, or --store for a store outside one")
            store = self.folder / "trajectories.db"
        self.store_path = Path(store)
        if not self.store_path.is_file():
            raise NotFound(f"no trajectory store at {self.store_path} (a run folder holds trajectories.db; "
                           "--store points at one elsewhere)")
        self.store = TrajectoryStore(self.store_path, readonly=True)
        self._tokenizer: Any = None

    # ------------------------------------------------------------------ runs and curves
    def metrics(self) -> list[dict]:
        """metrics.jsonl, one dict per iteration (a line being written is skipped)."""
        path = self.folder / "metrics.jsonl" if self.folder else None
        if path is None or not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(item, dict) and isinstance(item.get("iteration"), int):
                out.append(item)
        return out

    def results(self) -> dict | None:
        path = self.folder / "results.json" if self.folder else None
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return None

    def evaluations(self) -> dict[str, dict[str, float]]:
        """Held-out success, phase -> kind -> rate: results.json's, else the store's eval-* runs."""
        results = self.results()
        if results and isinstance(results.get("results"), dict):
            return results["results"]
        return self.store.evaluation_success()

    def training_run_id(self) -> str | None:
        path = self.folder / "run.json" if self.folder else None
        try:
            return str(json.loads(path.read_text())["run_id"])  # type: ignore[union-attr]  # None: AttributeError
        except (AttributeError, OSError, json.JSONDecodeError, KeyError, TypeError):
            return self.store.latest_training_run()  # no run.json (a bare store), or an unreadable one

    # ------------------------------------------------------------------ trajectories
    def list_trajectories(self, f: Filters, per_page: int = 50) -> tuple[list[TrajectoryRow], int]:
        """One page of matching trajectories and how many match in all."""
        return self.store.page(f.query, per_page, (f.page - 1) * per_page)

    def trajectory(self, trajectory_id: str) -> tuple[Trajectory, list[Step]]:
        """The trajectory and its steps, each with its credit and the prompt tokens it added."""
        traj = self.store.get(trajectory_id)
        return traj, self.steps(traj)

    def steps(self, traj: Trajectory) -> list[Step]:
        """A trajectory's steps, each with its credit and the prompt tokens it added."""
        credit = self.store.credit(traj.id)
        steps: list[Step] = []
        previous: list[int] = []
        for index, transition in enumerate(traj.transitions):
            step = Step(index, transition)
            if index in credit:
                c = credit[index]
                step.iteration, step.advantage, step.trained_tokens = c.iteration, c.advantage, c.trained_tokens
                step.teacher_logprobs = c.teacher_logprobs
            prompt = transition.prompt_token_ids
            shared = 0
            while shared < min(len(prompt), len(previous)) and prompt[shared] == previous[shared]:
                shared += 1
            step.new_prompt_ids = prompt[shared:]
            previous = prompt + transition.completion_token_ids
            steps.append(step)
        return steps

    def group(self, group_id: str) -> list[tuple[Trajectory, list[Step]]]:
        trajectories = list(self.store.iter(group_id=group_id))  # each read once
        if not trajectories:
            raise NotFound(f"no group {group_id!r} in {self.store_path}")
        return [(t, self.steps(t)) for t in trajectories]

    # ------------------------------------------------------------------ tokens
    def tokenizer_path(self) -> Path | None:
        """The trainer's copy in `tokenizer/`, else that of the model the run folder's
        config.json names (a model directory, or the embedded model's converted copy)."""
        if self.folder is None:
            return None
        candidates = [self.folder / "tokenizer" / "tokenizer.json"]
        for name in ("trainer.json", "config.json"):  # the trainer's record, the demo's settings
            try:
                model = json.loads((self.folder / name).read_text()).get("model")
            except (OSError, json.JSONDecodeError, AttributeError):
                continue
            if isinstance(model, str):
                from forge_bridge.policies import models

                candidates += [Path(model) / "tokenizer.json", models.cache_dir() / "models" / model / "tokenizer.json"]
        return next((p for p in candidates if p.is_file()), None)

    def tokenizer(self) -> Any:
        """The run's tokenizer, or None: tokens then show as their ids."""
        if self._tokenizer is None:
            path = self.tokenizer_path()
            if path is None:
                self._tokenizer = False
            else:
                from tokenizers import Tokenizer

                self._tokenizer = Tokenizer.from_file(str(path))
        return self._tokenizer or None

    def token_texts(self, ids: list[int]) -> list[str]:
        tokenizer = self.tokenizer()
        if tokenizer is None:
            return [f"⟨{i}⟩" for i in ids]
        return [tokenizer.decode([i], skip_special_tokens=False) or f"⟨{i}⟩" for i in ids]

    def close(self) -> None:
        self.store.close()


def first_divergence(steps_per_rollout: list[list[Step]]) -> int | None:
    """The first step index where the rollouts' completions differ (None: identical throughout)."""
    for k in range(max((len(s) for s in steps_per_rollout), default=0)):
        seen = {tuple(s[k].transition.completion_token_ids) if k < len(s) else None for s in steps_per_rollout}
        if len(seen) > 1:
            return k
    return None


__all__ = ["Filters", "RunView", "Step", "first_divergence"]
