"""Rollout collection: one iteration's episodes, run through the user's own rollout function,
read back as the `TrajectoryGroup`s the algorithms train on.

Each task is run `group_size` times concurrently, each run inside an episode the collector opens
(so every model call the agent makes is recorded into it). Exactly those episodes are read back:
an interrupted earlier attempt of the same iteration never mixes in. What is trained on is
decided by each trajectory's typed end reason (`Trajectory.trainable`): terminated, truncated
and the policy's own faults are (reward 0 when unscored); outages, crashes and unfinished
episodes are not, and are counted.
"""

from __future__ import annotations

import math
import random
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable, Sequence

from forge_bridge.core.episode import Recorder
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import END_REASONS, TrajectoryGroup

Rollout = Callable[[Any], float]
"""Runs the agent on one task inside the episode the trainer opened; returns the reward."""

TaskSchedule = Callable[[int], Sequence[Any]]
"""iteration -> the tasks of that iteration (a curriculum, or one task of each kind)."""


class RolloutError(InvalidArgument):
    """The rollout function is broken: it gave no finite reward, or every rollout raised."""


def task_id_of(task: Any, index: int) -> str:
    if isinstance(task, dict) and "id" in task:
        return str(task["id"])
    if hasattr(task, "id"):
        return str(task.id)
    return f"task-{index}"


def check_reward(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"the rollout function must return a finite number (the reward), got {value!r}")
    return float(value)


def tasks_for(it: int, tasks: list | TaskSchedule, per_iteration: int | None, seed: int) -> list[tuple[str, Any]]:
    """(task id, task) pairs of iteration `it`: the schedule's, or `per_iteration` drawn from the
    list (all of them when None), the same draw for the same seed and iteration."""
    if callable(tasks):
        chosen = list(tasks(it))
        if not chosen:
            raise InvalidArgument(f"the task schedule gave no tasks for iteration {it + 1}")
        return [(task_id_of(t, i), t) for i, t in enumerate(chosen)]
    indexed = [(task_id_of(t, i), t) for i, t in enumerate(tasks)]
    if per_iteration is None or per_iteration >= len(indexed):
        return indexed
    return random.Random(seed * 100_003 + it).sample(indexed, per_iteration)


def collect(rollout: Rollout, tasks: list[tuple[str, Any]], it: int, *, recorder: Recorder,
            run_id: str, group_size: int, concurrency: int, success_threshold: float = 1.0,
            progress: bool = True) -> tuple[list[TrajectoryGroup], dict]:
    """Run iteration `it`'s rollouts; returns its trainable groups (one per task and role) and
    statistics (episodes by end reason, mean reward, success rate)."""
    from tqdm.auto import tqdm

    jobs = [(tid, task, f"{run_id}-it{it + 1}-{tid}") for tid, task in tasks for _ in range(group_size)]
    bad_rewards: list[str] = []  # the reward function's bugs: always reported
    crashes: list[str] = []  # the agent crashed on a task: skipped, unless every rollout did
    opened: list[str] = []  # trajectory ids, a crew's roles included

    def one(tid: str, task: Any, group: str) -> None:
        kind = task.get("kind") if isinstance(task, dict) else getattr(task, "kind", None)
        metadata = {"iteration": it + 1, **({"kind": str(kind)} if isinstance(kind, (str, int)) else {})}
        ep = recorder.episode(tid, group, run_id=run_id, metadata=metadata)
        try:
            with ep:
                value = rollout(task)
                try:
                    ep.reward(check_reward(value))
                except ValueError as exc:
                    raise RolloutError(f"task {tid!r}: {exc}") from None
        except RolloutError as exc:  # recorded as crashed (above); reported after the iteration
            bad_rewards.append(str(exc))
        except Exception as exc:  # recorded with its end reason by the episode
            if ep.end_reason == "crashed":
                crashes.append(f"task {tid!r}: the rollout raised {type(exc).__name__}: {exc}")
        finally:  # a crew's steps live in its roles' trajectories
            opened.extend([child.id for child in ep.children.values()] or [ep.id])

    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(one, *job) for job in jobs]
        for f in tqdm(as_completed(futures), total=len(futures), desc=f"rollouts {it + 1}",
                      leave=False, disable=not progress):
            f.result()
    if bad_rewards:
        raise RolloutError(f"iteration {it + 1}: {bad_rewards[0]} ({len(bad_rewards)} rollout(s) "
                           "affected; their trajectories are stored as crashed, nothing was trained)")
    if len(crashes) == len(jobs):
        raise RolloutError(f"iteration {it + 1}: every rollout raised, e.g. {crashes[0]} "
                           "(trajectories stored as crashed, nothing was trained)")

    groups: dict[tuple, TrajectoryGroup] = {}
    ends = {reason: 0 for reason in END_REASONS} | {"incomplete": 0}
    reasons: list[str] = []
    rewards: list[float] = []
    mine = set(opened)
    for group_id in sorted({g for _, _, g in jobs}):  # each group's episodes in the order they began
        for traj in recorder.store.iter(run_id=run_id, group_id=group_id):
            if traj.id not in mine:
                continue
            ends[traj.end_reason or "incomplete"] += 1
            if not traj.trainable:
                reasons.append(f"{traj.end_reason or 'incomplete'}: {traj.end_detail}")
                continue
            if not traj.transitions:
                continue
            if traj.reward is None:  # cut by a limit or failed by the model, and never scored
                traj.reward = 0.0
            key = (group_id, traj.role)
            if key not in groups:
                groups[key] = TrajectoryGroup(group_id, traj.task_id, [], role=traj.role)
            groups[key].trajectories.append(traj)
            rewards.append(traj.reward)
    if reasons:
        print(f"iteration {it + 1}: not training on {len(reasons)} episode(s) (e.g. {reasons[0]})")
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else 0.0
    return list(groups.values()), {
        "episodes": len(jobs), "episodes_outage": ends["outage"], "episodes_crashed": ends["crashed"],
        "episodes_incomplete": ends["incomplete"], "episodes_failed": ends["outage"] + ends["crashed"],
        "episodes_truncated": ends["truncated"], "episodes_policy_fault": ends["policy_fault"],
        "reward_mean": mean, "reward_std": std,
        "success_rate": sum(r >= success_threshold for r in rewards) / len(rewards) if rewards else 0.0}


__all__ = ["Rollout", "RolloutError", "TaskSchedule", "check_reward", "collect", "task_id_of", "tasks_for"]
