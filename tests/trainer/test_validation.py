"""Validation inside training: the start and every `eval_every` iterations are scored greedily on
the validation tasks; the run stops after `patience` evaluations without a gain and ends serving
the best version, never one below the start. The rule of "is it better" is the promotion gate's.

The validation rollouts run the real agent on the real policy (one greedy call each, recorded);
what they score is scripted per version, so the test knows which version is best."""

import json
import sys
from pathlib import Path

import pytest

import forge_bridge as fb
from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import prefers

sys.path.insert(0, str(Path(__file__).resolve().parent))

import training_task  # noqa: E402

VALIDATION = [{"id": f"val-{i}", "kind": "odd" if i % 2 else "even", "question": training_task.QUESTION, "rank": i}
              for i in range(4)]


def rollout_scoring(policy, solved: dict):
    """The training agent's rollout; a validation task `rank` i is solved when the version serving
    it solves more than i of the 4 (`solved[version]`)."""
    train = training_task.make_rollout(training_task.agent_for(policy))

    def rollout(task) -> float:
        reward = train(task)
        if "rank" not in task:
            return reward
        return float(task["rank"] < solved[policy.current()])
    return rollout


def train(taught_model_dir, tmp_path, solved, iterations, **validation):
    policy = fb.LocalPolicy(str(taught_model_dir), keep_versions=2)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(group_size=2, out_dir=str(tmp_path / "run"), run_name="val",
                                                   progress=False))
    history = trainer.train(rollout_scoring(policy, solved), training_task.TASKS, iterations,
                            validation=VALIDATION, **validation)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    return policy, trainer, history, events


def test_the_best_version_on_validation_serves_when_the_run_stops_for_want_of_a_gain(taught_model_dir, tmp_path):
    # start 1 of 4; v1 3 of 4 (the best); then 2, 2 and 3 (a tie is no gain): patience 3 stops after v4
    solved = {None: 1, "val-v1": 3, "val-v2": 2, "val-v3": 2, "val-v4": 3, "val-v5": 4}
    policy, trainer, history, events = train(taught_model_dir, tmp_path, solved, 6, patience=3)
    try:
        assert [h["iteration"] for h in history] == [1, 2, 3, 4]  # stopped: v5 never ran
        assert [h["val/success"] for h in history] == [0.75, 0.5, 0.5, 0.75]
        assert history[0]["val/success/odd"] == 0.5 and history[0]["val/success/even"] == 1.0
        assert [h["val/best_iteration"] for h in history] == [1, 1, 1, 1]
        assert [h["val/gain"] for h in history] == [True, False, False, False]
        start, best = events[0], events[-1]
        assert start["event"] == "validation" and start["val/success"] == 0.25
        assert best["event"] == "best_on_validation" and best["iteration"] == 1 and best["success"] == 0.75
        # v1 had left the policy (it keeps 2 versions): loaded again from the run's folder
        assert policy.current() == "val-v1-best" == best["versions"]["default"]
        (stored,) = trainer.recorder.store.trajectories(run_id=f"{trainer.run_id}-val-4")[:1]
        assert stored.transitions  # the validation rollouts are recorded apart from the training ones
        assert not trainer.recorder.store.trajectories(run_id=trainer.run_id, task_id="val-0")
        # resumed, it stops at once (its checkpoint holds the scores and the evaluations without a gain)
        again = trainer.train(rollout_scoring(policy, solved), training_task.TASKS, 6, resume=True,
                              validation=VALIDATION, patience=3)
        assert len(again) == 4 and policy.current() == "val-v1-best"
    finally:
        trainer.close()
        policy.close()


def test_a_run_that_only_gets_worse_ends_serving_where_it_started(taught_model_dir, tmp_path):
    solved = {None: 3, "val-v1": 1, "val-v2": 2}
    policy, trainer, history, events = train(taught_model_dir, tmp_path, solved, 2, eval_every=2)
    try:
        assert "val/success" not in history[0] and history[1]["val/success"] == 0.5  # every 2nd, and the last
        assert events[-1]["iteration"] == 0 and policy.current() is None  # the base model, as at the start
    finally:
        trainer.close()
        policy.close()


def test_validation_settings_are_checked_and_the_rule_is_the_gates():
    from forge_bridge.trainer.validation import Validation

    with pytest.raises(InvalidArgument, match="patience"):
        Validation(VALIDATION, patience=0)
    with pytest.raises(InvalidArgument, match="validation"):
        Validation(())
    with pytest.raises(InvalidArgument, match="eval_every"):
        Validation(VALIDATION, every=True)
    assert prefers(0.6, 0.5) and not prefers(0.5, 0.5) and not prefers(0.52, 0.5, margin=0.05)
