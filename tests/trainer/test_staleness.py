"""Asynchronous iterations (`max_staleness`): the next iteration's rollouts run during this
iteration's update, on the version served then, and a step older than the bound is never trained."""

import threading

import pytest

import forge_bridge as fb
from forge_bridge.core.types import Action, Observation, Trajectory, TrajectoryGroup, Transition
from forge_bridge.trainer.rollouts import drop_stale

import training_task


def served_by(*versions):
    return Trajectory(group_id="g", transitions=[
        Transition(observation=Observation(messages=[{"role": "user", "content": "q"}]), action=Action(content="a"),
                   version=v) for v in versions])


def test_a_trajectory_with_a_step_older_than_the_bound_is_left_out_and_counted():
    index = {"run-v1": 1, "run-v2": 2, "run-v3": 3}
    age = lambda version: 3 - index.get(version or "", 0)  # noqa: E731  the update's version is v3
    fresh, mixed, old, base = (served_by("run-v3"), served_by("run-v2", "run-v3"), served_by("run-v1", "run-v3"),
                               served_by(None))
    group = TrajectoryGroup(group_id="g", task_id="t", trajectories=[fresh, mixed, old, base])
    (kept,), stats = drop_stale([group], age, 1)
    assert kept.trajectories == [fresh, mixed]
    assert stats == {"stale_dropped": 2, "staleness_max": 3, "stale_step_share": 3 / 6}
    (everything,), _ = drop_stale([group], age, 3)
    assert everything.trajectories == group.trajectories
    assert drop_stale([TrajectoryGroup(group_id="g", task_id="t", trajectories=[old])], age, 1)[0] == []
    with pytest.raises(ValueError, match="max_staleness"):
        fb.GRPOConfig(max_staleness=-1)


def test_the_next_iterations_rollouts_run_during_the_update_on_the_version_served_then(tmp_path):
    policy = fb.LocalPolicy(training_task.choice_model(tmp_path / "model"))
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=4, lr=3e-3, out_dir=str(tmp_path / "run"),
                                                   run_name="ahead", progress=False, max_staleness=1, seed=0))
    per_iteration = 4 * len(training_task.TASKS)
    rollout = training_task.make_rollout(training_task.agent_for(policy))
    done, changed = [0], threading.Condition()

    def counted(task):
        reward = rollout(task)
        with changed:
            done[0] += 1
            changed.notify_all()
        return reward

    prepare = trainer.prepare

    def update_after_an_episode_ahead(groups):  # the update begins here, the next iteration's rollouts running
        if trainer.ahead is not None and trainer.ahead.pending:  # the last iteration starts none
            this = trainer.iteration + 1
            with changed:  # an episode of the next iteration finishes before this update publishes anything
                assert changed.wait_for(lambda: done[0] > this * per_iteration, 120), "nothing ran ahead"
        return prepare(groups)

    trainer.prepare = update_after_an_episode_ahead
    history = trainer.train(counted, training_task.TASKS, iterations=3)
    policy.close()
    assert [m["iteration"] for m in history] == [1, 2, 3]
    # iteration 1 ran before any update; 2 and 3 each had an episode finished before the update
    # that published the version they train against: one version behind, within the bound
    assert "staleness_max" in history[0] and history[0]["staleness_max"] == 0
    assert [m["staleness_max"] for m in history[1:]] == [1, 1]
    assert all(m["stale_dropped"] == 0 and m["stale_step_share"] > 0 for m in history[1:])
    # the last iteration started nothing ahead: every episode recorded was trained (3 x 4)
    assert trainer.recorder.store.count() == 3 * per_iteration
    for it, versions in ((2, {"ahead-v1", None}), (3, {"ahead-v1", "ahead-v2"})):
        steps = {s.version for t in trainer.recorder.store.trajectories() if t.metadata.get("iteration") == it
                 for s in t.transitions}
        assert steps <= versions and steps & ({None} if it == 2 else {"ahead-v1"}), (it, steps)
