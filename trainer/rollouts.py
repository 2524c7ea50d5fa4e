"""Rollout collection: one iteration's episodes, run through the user's own rollout function,
read back as the `TrajectoryGroup`s the algorithms train on.

Each task is run `group_size` times concurrently, each run inside an episode the collector opens
(so every model call the agent makes is recorded into it): on a thread pool here, or by an
`EpisodeRunner` elsewhere (Ray workers), which streams each episode into the same store. Exactly those episodes are read back:
an interrupted earlier attempt of the same iteration never mixes in. What is trained on is
decided by each trajectory's typed end reason (`Trajectory.trainable`): terminated, truncated
and the policy's own faults are (reward 0 when unscored); outages, crashes and unfinished
episodes are not, and are counted.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import math
import random
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, cast

from forge_bridge.core.episode import Recorder, derive_seed
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import END_REASONS, Trajectory, TrajectoryGroup, group_trajectories, success_rate

log = logging.getLogger(__name__)
"""Episodes lost, left out or cut short: shown with or without progress bars."""

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


def tasks_for(it: int, tasks: Sequence[Any] | TaskSchedule, per_iteration: int | None, seed: int
              ) -> list[tuple[str, Any]]:
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


@dataclass(frozen=True)
class Job:
    """One rollout to run: a task, the group it belongs to, and its episode's metadata."""

    task_id: str
    task: Any
    group_id: str
    metadata: dict
    seed: int | None = None
    """The episode's seed: its sampled calls do not depend on which others shared a batch."""
    behaviour: str = "policy"
    """Whose behaviour the episode records (`BEHAVIOURS`): a guide's rollouts are never on-policy."""


@dataclass
class Outcome:
    """How one job went: the trajectories it opened (a crew's roles included), and the reward
    function's bug, the agent's crash, or the loss of the worker that ran it, if any."""

    opened: list[str] = field(default_factory=list)
    bad_reward: str | None = None
    crash: str | None = None
    lost: str | None = None


class EpisodeRunner(abc.ABC):
    """Runs jobs somewhere else (Ray workers: `forge_bridge.scale.RayRollouts`), each in an
    episode recorded into `recorder`'s store, complete and exactly once."""

    @abc.abstractmethod
    def run_episodes(self, jobs: list[Job], *, policy: Any, recorder: Recorder, run_id: str,
                     desc: str, progress: bool) -> list[Outcome]: ...


def field_of(task: Any, key: str) -> Any:
    """`task[key]` of a dict task, `task.<key>` of another; None when it has none."""
    return task.get(key) if isinstance(task, dict) else getattr(task, key, None)


def episode_metadata(task: Any, it: int) -> dict:
    """What every episode of iteration `it` is tagged with: the iteration, and the task's kind."""
    kind = field_of(task, "kind")
    return {"iteration": it + 1, **({"kind": str(kind)} if isinstance(kind, (str, int)) else {})}


def run_episode(rollout: Rollout, job: Job, recorder: Recorder, run_id: str) -> Outcome:
    """Run the agent on one task inside an episode it opens; the episode records every model
    call and ends with the reward, or with how the rollout failed."""
    outcome = Outcome()
    ep = recorder.episode(job.task_id, job.group_id, run_id=run_id, metadata=job.metadata, seed=job.seed,
                          behaviour=job.behaviour)
    try:
        with ep:
            value = rollout(job.task)
            try:
                ep.reward(check_reward(value))
            except ValueError as exc:
                raise RolloutError(f"task {job.task_id!r}: {exc}") from None
    except RolloutError as exc:  # recorded as crashed (above); reported after the iteration
        outcome.bad_reward = str(exc)
    except Exception as exc:  # recorded with its end reason by the episode
        if ep.end_reason == "crashed":
            outcome.crash = f"task {job.task_id!r}: the rollout raised {type(exc).__name__}: {exc}"
    finally:  # a crew's steps live in its roles' trajectories
        outcome.opened = [child.id for child in ep.children.values()] or [ep.id]
    return outcome


def run_threaded(rollout: Rollout, jobs: list[Job], *, recorder: Recorder, run_id: str,
                 concurrency: int, desc: str, progress: bool) -> list[Outcome]:
    """The jobs on a thread pool in this process, all on the same agent object."""
    from tqdm.auto import tqdm

    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(run_episode, rollout, job, recorder, run_id) for job in jobs]
        for f in tqdm(as_completed(futures), total=len(futures), desc=desc, leave=False,
                      disable=not progress):
            f.result()
    return [f.result() for f in futures]


def collect(rollout: Rollout | EpisodeRunner, tasks: list[tuple[str, Any]], it: int, *,
            recorder: Recorder, run_id: str, group_size: int, concurrency: int,
            success_threshold: float = 1.0, progress: bool = True,
            policy: Any = None, seed: int | None = None, desc: str | None = None,
            behaviour: str = "policy") -> tuple[list[TrajectoryGroup], dict]:
    """Run iteration `it`'s rollouts (here on threads, or through an `EpisodeRunner`); returns
    its trainable groups (one per task and role, each in rollout order) and statistics
    (episodes by end reason, mean reward, success rate). With `seed`, rollout k of a task gets
    an episode seed from (seed, it, task id, k): the same run samples the same rollouts
    whatever the timing of the threads or workers. `desc`: the progress bar's label; `behaviour`:
    whose behaviour the episodes are (a teacher's guide rollouts: 'guide')."""
    jobs = [Job(tid, task, f"{run_id}-it{it + 1}-{tid}", episode_metadata(task, it) | {"rollout": k},
                None if seed is None else derive_seed(seed, "rollout", it, tid, k), behaviour)
            for tid, task in tasks for k in range(group_size)]
    desc = desc or f"rollouts {it + 1}"
    if isinstance(rollout, EpisodeRunner):
        outcomes = rollout.run_episodes(jobs, policy=policy, recorder=recorder, run_id=run_id,
                                        desc=desc, progress=progress)
    else:
        outcomes = run_threaded(rollout, jobs, recorder=recorder, run_id=run_id,
                                concurrency=concurrency, desc=desc, progress=progress)
    lost = check_outcomes(outcomes, it)
    return read_back(recorder, run_id, jobs, [tid for o in outcomes for tid in o.opened], lost,
                     success_threshold, it)


def drop_stale(groups: list[TrajectoryGroup], age: Callable[[str | None], int], max_staleness: int
               ) -> tuple[list[TrajectoryGroup], dict]:
    """The groups without their trajectories that have a step served more than `max_staleness`
    versions before the update (`age(version)`: how many versions the step's lags the update's),
    and what that did: `stale_dropped` (trajectories left out, never trained), `staleness_max`
    (the oldest step's lag) and `stale_step_share` (the share of steps served by an older version)."""
    kept: list[TrajectoryGroup] = []
    dropped = oldest = stale = steps = 0
    for group in groups:
        mine = []
        for traj in group.trajectories:
            ages = [age(step.version) for step in traj.transitions]
            oldest, stale, steps = max([oldest, *ages]), stale + sum(a > 0 for a in ages), steps + len(ages)
            if ages and max(ages) > max_staleness:
                dropped += 1
            else:
                mine.append(traj)
        if mine:
            kept.append(dataclasses.replace(group, trajectories=mine))
    return kept, {"stale_dropped": dropped, "staleness_max": oldest, "stale_step_share": stale / max(steps, 1)}


class Ahead:
    """The next iteration's rollouts, collected on a thread of their own while this iteration
    updates (`RolloutConfig.max_staleness` >= 1): `collect(it)` runs iteration `it`'s rollouts."""

    def __init__(self, collect: Callable[[int], tuple[list[TrajectoryGroup], dict]], iterations: int) -> None:
        self.collect, self.iterations = collect, iterations
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="forge-rollouts-ahead")
        self.pending: dict[int, Future] = {}

    def start(self, it: int) -> None:
        """Begin iteration `it`'s rollouts, unless the run ends before it or they already run."""
        if it < self.iterations and it not in self.pending:
            self.pending[it] = self.pool.submit(self.collect, it)

    def take(self, it: int) -> tuple[list[TrajectoryGroup], dict] | None:
        """Iteration `it`'s rollouts, once done (None: none were started ahead); their error, if any."""
        future = self.pending.pop(it, None)
        return None if future is None else future.result()

    def close(self) -> list[int]:
        """Wait for rollouts still running (they use the policy) and end the thread; returns the
        iterations whose rollouts were collected but will not be trained in this call (their
        episodes stay in the store; a resumed run collects those iterations again)."""
        left = sorted(self.pending)
        for future in self.pending.values():
            try:
                future.result()
            except Exception as exc:  # the run is over: nobody trains on these rollouts; say what went wrong
                log.warning("rollouts collected ahead, not to be trained, failed: %s", exc)
        self.pending.clear()
        self.pool.shutdown()
        return left


def check_outcomes(outcomes: list[Outcome], it: int) -> list[str]:
    """Raise `RolloutError` when the iteration cannot be trained on (the reward function is
    broken, or every rollout raised or was lost); returns the lost episodes' reasons."""
    bad_rewards = [o.bad_reward for o in outcomes if o.bad_reward]  # the reward function's bugs
    crashes = [o.crash for o in outcomes if o.crash]  # skipped, unless every rollout crashed
    lost = [o.lost for o in outcomes if o.lost]  # a worker died: its episode stays incomplete
    if bad_rewards:
        raise RolloutError(f"iteration {it + 1}: {bad_rewards[0]} ({len(bad_rewards)} rollout(s) "
                           "affected; their trajectories are stored as crashed, nothing was trained)")
    if len(crashes) == len(outcomes):
        raise RolloutError(f"iteration {it + 1}: every rollout raised, e.g. {crashes[0]} "
                           "(trajectories stored as crashed, nothing was trained)")
    if len(crashes) + len(lost) == len(outcomes):
        raise RolloutError(f"iteration {it + 1}: every rollout raised or was lost with its worker, e.g. "
                           f"{(lost + crashes)[0]} (what was recorded is kept; nothing was trained)")
    if lost:
        log.warning("iteration %d: %d episode(s) lost with their worker, kept incomplete (e.g. %s)",
                    it + 1, len(lost), lost[0])
    return lost


def read_back(recorder: Recorder, run_id: str, jobs: list[Job], opened: list[str], lost: list[str],
              success_threshold: float, it: int) -> tuple[list[TrajectoryGroup], dict]:
    """The trainable groups of exactly the episodes these jobs opened, and the iteration's
    statistics (episodes by end reason, mean reward, success rate, and per task kind:
    'success/<kind>')."""
    trained: list[Trajectory] = []
    ends = {reason: 0 for reason in END_REASONS} | {"incomplete": 0}
    reasons: list[str] = []
    cut: list[str] = []
    mine = set(opened)
    for group_id in sorted({job.group_id for job in jobs}):
        for traj in recorder.store.iter(run_id=run_id, group_id=group_id):
            if traj.id not in mine:
                continue
            ends[traj.end_reason or "incomplete"] += 1
            if traj.end_reason == "truncated":
                cut.append(traj.end_detail or "a limit")
            if not traj.trainable:
                reasons.append(f"{traj.end_reason or 'incomplete'}: {traj.end_detail}")
                continue
            if not traj.transitions:
                continue
            if traj.reward is None:  # cut by a limit or failed by the model, and never scored
                traj.reward = 0.0
            trained.append(traj)
    groups = group_trajectories(trained)
    for group in groups:  # in rollout order, not the order the threads began them in
        group.trajectories.sort(key=lambda t: t.metadata.get("rollout", 0))
    if reasons:
        log.warning("iteration %d: not training on %d episode(s) (e.g. %s)", it + 1, len(reasons), reasons[0])
    if cut:
        log.warning("iteration %d: %d of %d episode(s) truncated, cut by %s: trained on with the reward they "
                    "had (raise the limit if the agent needs more room)", it + 1, len(cut), len(jobs), cut[0])
    rewards = [float(cast(float, t.reward)) for t in trained]  # each one scored above (None: 0.0)
    by_kind: dict[str, list[float]] = {}
    for t in trained:
        if "kind" in t.metadata:
            by_kind.setdefault(str(t.metadata["kind"]), []).append(float(cast(float, t.reward)))
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else 0.0
    return groups, {
        "episodes": len(jobs), "episodes_outage": ends["outage"], "episodes_crashed": ends["crashed"],
        "episodes_incomplete": ends["incomplete"], "episodes_failed": ends["outage"] + ends["crashed"],
        "episodes_truncated": ends["truncated"], "episodes_policy_fault": ends["policy_fault"],
        "episodes_lost": len(lost),
        "reward_mean": mean, "reward_std": std,
        "success_rate": success_rate(rewards, success_threshold),
        **{f"success/{kind}": success_rate(mine, success_threshold) for kind, mine in sorted(by_kind.items())},
        **{f"calls/{name}": share for name, share in call_formats(trained).items()}}


def call_formats(trajectories: list[Trajectory]) -> dict[str, float]:
    """The share of each format among the steps whose tool calls were read (`Action.call_format`),
    with `malformed` for steps that tried to call and none could be read."""
    counts: dict[str, int] = {}
    for traj in trajectories:
        for step in traj.transitions:
            name = step.action.call_format or ("malformed" if step.action.malformed else "")
            if name:
                counts[name] = counts.get(name, 0) + 1
    total = sum(counts.values())
    return {name: n / total for name, n in sorted(counts.items())}


__all__ = ["Ahead", "drop_stale", "EpisodeRunner", "call_formats", "field_of", "Job", "Outcome", "Rollout", "RolloutError", "TaskSchedule", "check_outcomes",
           "check_reward", "collect", "read_back", "episode_metadata", "run_episode", "run_threaded", "task_id_of", "tasks_for"]
