"""A task schedule (iteration -> tasks) picks each iteration's tasks instead of random draws."""

import pytest

import forge_bridge as fb
from forge_bridge.core.recording import transition_of
from forge_bridge.policies import models


def test_a_schedule_chooses_the_tasks_of_each_iteration(tmp_path):
    policy = fb.LocalPolicy(str(models.save(*models.tiny(), tmp_path / "tiny")))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=2, out_dir=str(tmp_path / "run"),
                                                   progress=False, concurrency=1))

    def rollout(task) -> float:
        messages = [{"role": "user", "content": task["id"]}]
        fb.current_episode().record(transition_of(policy.chat(messages, max_tokens=4), messages))
        return float(task["id"].endswith("a"))

    def schedule(it: int) -> list[dict]:
        return [{"id": f"it{it}-a"}, {"id": f"it{it}-b"}]

    trainer.train(rollout, schedule, iterations=2)
    by_iteration = {}
    for t in trainer.recorder.store.trajectories():
        by_iteration.setdefault(t.metadata["iteration"], set()).add(t.task_id)
    assert by_iteration == {1: {"it0-a", "it0-b"}, 2: {"it1-a", "it1-b"}}
    with pytest.raises(ValueError, match="gave no tasks for iteration 3"):
        trainer.train(rollout, lambda it: [], iterations=3)
    policy.close()
