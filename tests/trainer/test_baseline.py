"""GRPO's baseline: the task's own group, or every rollout of the iteration (per role), checked
against hand-computed advantages."""

import pytest
import torch

import forge_bridge as fb
from forge_bridge.core.types import Action, Observation, Trajectory, TrajectoryGroup, Transition
from forge_bridge.policies import models
from forge_bridge.trainer.config import GRPOConfig, PPOConfig
from forge_bridge.trainer.grpo import grpo_advantages
from forge_bridge.trainer.ppo import ppo_advantages


def rollout(reward: float, token: int, group: str = "g", role: str | None = None, steps: int = 1) -> Trajectory:
    step = Transition(observation=Observation(messages=[{"role": "user", "content": "q"}]),
                      action=Action(content="a"), prompt_token_ids=[1, 2], completion_token_ids=[token],
                      completion_logprobs=[-0.5])
    return Trajectory(transitions=[step] * steps, reward=reward, group_id=group, role=role)


def group(group_id: str, *trajectories: Trajectory) -> TrajectoryGroup:
    return TrajectoryGroup(group_id, None, list(trajectories), role=trajectories[0].role)


def test_grpo_advantages_by_hand():
    # Two steps, each from the same prompt [1, 2]: one state, reached twice by each rollout. The
    # pass (token 10) has returns [0.5, 1] at gamma 0.5, the fail (token 11) [0, 0].
    two = [group("g", rollout(1.0, 10, steps=2), rollout(0.0, 11, steps=2))]
    (adv,) = grpo_advantages(two, GRPOConfig(gamma=0.5, credit="trajectory"))  # episode level: +-1
    assert [a.tolist() for a in adv] == [pytest.approx([1.0, 1.0], abs=1e-4), pytest.approx([-1.0, -1.0], abs=1e-4)]
    # anchor: the state's returns 0.5, 1, 0, 0 (mean 0.375, std 0.41458); Q(10) = 0.75, Q(11) = 0
    # -> (Q - V) / std = +-0.375 / 0.41458 = +-0.90453, added to the episode's +-1
    (adv,) = grpo_advantages(two, GRPOConfig(gamma=0.5))
    assert [a.tolist() for a in adv] == [pytest.approx([1.90453] * 2, abs=1e-4),
                                         pytest.approx([-1.90453] * 2, abs=1e-4)]
    # without the std: episode 1 - 0.5 = 0.5, step 0.75 - 0.375 = 0.375
    (adv,) = grpo_advantages(two, GRPOConfig(gamma=0.5, scale_by_std=False))
    assert [a.tolist() for a in adv] == [pytest.approx([0.875, 0.875]), pytest.approx([-0.875, -0.875])]


def test_ppo_advantages_by_hand():
    # rewards [0, 1] (the outcome on the last step), values [0.5, 0.5], gamma 0.9, lambda 0.5:
    # t=1: delta = 1 - 0.5 = 0.5 -> A = 0.5; t=0: delta = 0.9 * 0.5 - 0.5 = -0.05 -> A = -0.05 + 0.45 * 0.5
    traj = rollout(1.0, 10, steps=2)
    (adv,), (target,) = ppo_advantages([traj], [torch.tensor([0.5, 0.5])], PPOConfig(gamma=0.9, lam=0.5))
    assert adv.tolist() == pytest.approx([0.175, 0.5]) and target.tolist() == pytest.approx([0.675, 1.0])
    # V(s_T) = 0.4 is bootstrapped only after a truncated episode: then delta_1 = 0.9 * 0.4 - 0.5
    # = -0.14 and delta_0 = -0.05 -> A_0 = -0.05 + 0.45 * -0.14 = -0.113; terminated: as above.
    (adv,), _ = ppo_advantages([traj], [torch.tensor([0.5, 0.5])], PPOConfig(gamma=0.9, lam=0.5), [0.4])
    assert adv.tolist() == pytest.approx([0.175, 0.5])
    cut = rollout(0.0, 10, steps=2)
    cut.end_reason = "truncated"
    (adv,), (target,) = ppo_advantages([cut], [torch.tensor([0.5, 0.5])], PPOConfig(gamma=0.9, lam=0.5), [0.4])
    assert adv.tolist() == pytest.approx([-0.113, -0.14]) and target.tolist() == pytest.approx([0.387, 0.36])


def advantages(trainer, groups) -> dict[int, float]:
    samples, _, stats = trainer.prepare(groups)
    return {s.input_ids[-1]: s.advantages[-1] for s in samples}, stats


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(models.save(*models.tiny(), tmp_path_factory.mktemp("tiny") / "m"))


@pytest.mark.parametrize("baseline", ["group", "batch"])
def test_advantages_against_the_group_or_the_whole_batch(tiny_dir, tmp_path, baseline):
    policy = fb.LocalPolicy(tiny_dir)
    trainer = fb.GRPOTrainer(policy, fb.GRPOConfig(baseline=baseline, credit="trajectory", kl_beta=0.0,
                                                   out_dir=str(tmp_path), progress=False))  # no KL: silent groups skipped
    groups = [group("all-pass", rollout(1.0, 10, "all-pass"), rollout(1.0, 11, "all-pass")),
              group("mixed", rollout(1.0, 12, "mixed"), rollout(0.0, 13, "mixed")),
              group("other-role", rollout(0.0, 14, "other-role", "critic"), rollout(1.0, 15, "other-role", "critic"))]
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
