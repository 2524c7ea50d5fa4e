"""GRPO's baseline: the task's own group, or every rollout of the iteration (per role), checked
against hand-computed advantages."""

import pytest

import forge_bridge as fb
from forge_bridge import models
from forge_bridge.types import Action, Observation, Trajectory, Transition


def rollout(reward: float, token: int) -> Trajectory:
    step = Transition(observation=Observation(messages=[{"role": "user", "content": "q"}]),
                      action=Action(content="a"), prompt_token_ids=[1, 2], completion_token_ids=[token],
                      completion_logprobs=[-0.5])
    return Trajectory(transitions=[step], reward=reward)


def advantages(trainer, groups) -> dict[int, float]:
    samples, _, stats = trainer.prepare(groups)
    return {s.input_ids[-1]: s.advantages[-1] for s in samples}, stats


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(models.save(*models.tiny(), tmp_path_factory.mktemp("tiny") / "m"))


@pytest.mark.parametrize("baseline", ["group", "batch"])
def test_advantages_against_the_group_or_the_whole_batch(tiny_dir, tmp_path, baseline):
    policy = fb.LocalPolicy(tiny_dir)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(baseline=baseline, out_dir=str(tmp_path), progress=False))
    groups = {("all-pass", None): [rollout(1.0, 10), rollout(1.0, 11)],
              ("mixed", None): [rollout(1.0, 12), rollout(0.0, 13)],
              ("other-role", "critic"): [rollout(0.0, 14), rollout(1.0, 15)]}
    adv, stats = advantages(trainer, groups)
    if baseline == "group":  # the all-pass group says nothing and is left out
        assert adv == pytest.approx({12: 1.0, 13: -1.0, 14: -1.0, 15: 1.0}, abs=1e-4)
        assert stats["groups_uniform"] == 1
    else:  # role None: rewards 1, 1, 1, 0 -> mean 0.75, std 0.433; the critic role apart
        assert adv == pytest.approx({10: 0.57735, 11: 0.57735, 12: 0.57735, 13: -1.73205,
                                     14: -1.0, 15: 1.0}, abs=1e-4)
        assert stats["groups_uniform"] == 0 and stats["groups_trained"] == 3
    policy.close()
    with pytest.raises(ValueError, match="baseline"):
        fb.GRPOConfig(baseline="global")
