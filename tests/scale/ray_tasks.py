"""What the Ray tests' workers import (they see this folder through PYTHONPATH): the learning
tests' add-or-multiply task, and a rollout that can be made to hang once, mid-episode."""

from __future__ import annotations

import os
import time
from pathlib import Path

import training_task

TASKS = training_task.TASKS


def choice_rollout(policy):
    """One worker's agent: an ordinary LangChain create_agent agent on the worker's policy client."""
    return training_task.make_rollout(training_task.agent_for(policy))


class HangOnce:
    """make_rollout for the kill test: the first episode of a task with "hang" records its steps,
    leaves its worker's actor id and how many steps it recorded in `marker`, and waits to be
    killed."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, policy):
        inner = choice_rollout(policy)

        def rollout(task) -> float:
            reward = inner(task)
            if task.get("hang"):
                try:  # the first episode to get here takes the lock, and keeps it
                    os.close(os.open(self.marker + ".lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    return reward
                import ray

                from forge_bridge.core.episode import current_episode

                steps = len(current_episode().trajectory.transitions)  # recorded before the kill
                Path(self.marker + ".tmp").write_text(f"{ray.get_runtime_context().get_actor_id()} {steps}")
                os.rename(self.marker + ".tmp", self.marker)
                time.sleep(300)  # killed long before
            return reward
        return rollout


def hung_worker(marker: Path, timeout_s: float = 120) -> tuple[str, int]:
    """(actor id, steps recorded) of the episode that hangs."""
    deadline = time.time() + timeout_s
    while not marker.exists():
        if time.time() > deadline:
            raise TimeoutError(f"no worker wrote {marker}")
        time.sleep(0.1)
    actor_id, steps = marker.read_text().split()
    return actor_id, int(steps)
