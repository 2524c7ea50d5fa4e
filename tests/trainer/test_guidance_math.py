"""The teacher's terms by hand: the guide tokens' shaping weight, the objective over policy, guide
and relabelled tokens, the distillation reward, and the guided advantage over a group's union --
a group with no on-policy success gets a gradient on the guide's tokens and on the failed rollouts."""

import math

import pytest
import torch

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Action, Observation, Trajectory, TrajectoryGroup, Transition
from forge_bridge.trainer.advantages import distillation_rewards
from forge_bridge.trainer.batch import build_samples, collate
from forge_bridge.trainer.config import GRPOConfig, Guidance, LossConfig
from forge_bridge.trainer.grpo import grpo_advantages
from forge_bridge.trainer.losses import guide_policy_loss, policy_objective, shaping_weight
from forge_bridge.trainer.teacher import as_guide, own_success_rate, with_guides

CONFIG = LossConfig(clip_low=0.2, clip_high=0.2, tis_cap=2.0, kl_beta=0.0, aggregation="token")


def test_the_shaping_weight_and_its_gradient_by_hand():
    logp = torch.tensor([[math.log(0.5), math.log(0.01)]], requires_grad=True)
    f = shaping_weight(logp, 0.1)
    assert f.tolist()[0] == pytest.approx([0.5 / 0.6, 0.01 / 0.11])
    guide_policy_loss(logp, torch.ones(1, 2), 0.1).sum().backward()
    # d(-f)/dlogp = -gamma * p / (p + gamma)^2: an unlikely token (p = 0.01) is pushed harder per unit of
    # probability than the plain likelihood would push it, a likely one gently
    assert logp.grad.tolist()[0] == pytest.approx([-0.1 * 0.5 / 0.36, -0.1 * 0.01 / 0.11 ** 2])


def test_the_objective_over_policy_guide_and_relabelled_tokens_by_hand():
    # position 0 is a prompt token; 1 the policy's own (A = 2), 2 a guide's (A = 1, p = 0.5),
    # 3 a relabelled one (p = 0.25, weight 0.5)
    logp = torch.tensor([[0.0, math.log(0.9), math.log(0.5), math.log(0.25)]], requires_grad=True)
    old = sampler = logp.detach().clone()
    advantages = torch.tensor([[0.0, 2.0, 1.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    guide = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    relabel = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    loss, stats = policy_objective(logp, old, sampler, advantages, mask, None, CONFIG, guide_mask=guide, shaping=0.1,
                                   relabel_mask=relabel, relabel_weight=0.5)
    expected = (-2.0 * 1.0 - (0.5 / 0.6) * 1.0 + 0.5 * math.log(4)) / 3
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -2.0 / 3, -(0.1 * 0.5 / 0.36) / 3, -0.5 / 3], abs=1e-6)
    assert stats["guide_weight_mean"] == pytest.approx(0.5 / 0.6)
    assert stats["ratio_mean"] == pytest.approx(1.0)  # over the policy's own tokens only


def test_without_masks_the_objective_is_the_clipped_surrogate_as_before():
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]], requires_grad=True)
    old = torch.log(torch.tensor([[0.25, 0.2]]))  # ratio 2 on the first token: clipped at 1.2
    loss, stats = policy_objective(logp, old, old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), None, CONFIG)
    # tis weight min(pi_old / pi_sampler, 2) = 1; -(1.2 * 1) and -(1 * -1) averaged
    assert float(loss.detach()) == pytest.approx((-1.2 + 1.0) / 2)
    assert stats["clip_fraction"] == pytest.approx(0.5)


def test_the_distillation_reward_by_hand():
    rewards = distillation_rewards(torch.tensor([-1.0, -2.0]), torch.tensor([-0.5, -3.0]), 0.5)
    assert rewards.tolist() == pytest.approx([0.25, -0.5])
    with pytest.raises(InvalidArgument, match="must match"):
        distillation_rewards(torch.zeros(2), torch.zeros(3), 1.0)


def step(prompt, completion):
    return Transition(Observation([{"role": "user", "content": "q"}]), Action(content="a"),
                      prompt_token_ids=prompt, completion_token_ids=completion,
                      completion_logprobs=[-1.0] * len(completion), temperature=1.0)


def failing_group(n=4):
    trajs = [Trajectory([step([1, 2, 3], [7, 8])], task_id="t", group_id="g", reward=0.0, end_reason="terminated")
             for _ in range(n)]
    return TrajectoryGroup("g", "t", trajs)


def demonstration(task="t"):
    return Trajectory([step([1, 2, 3], [5, 6])], task_id=task, group_id="demos", reward=1.0,
                      end_reason="terminated", behaviour="demonstration")


def test_the_guided_advantage_over_the_union_by_hand():
    group = failing_group()
    assert own_success_rate(group, 1.0) == 0.0
    guided = with_guides(group, [as_guide(demonstration(), group, 0)])
    assert own_success_rate(guided, 1.0) == 0.0  # a guide's success is never the policy's
    (advs,) = grpo_advantages([guided], GRPOConfig(credit="trajectory"))
    # returns [0, 0, 0, 0, 1]: mean 0.2, population std 0.4 -> failures -0.5, the guide +2
    assert [float(a[0]) for a in advs] == pytest.approx([-0.5] * 4 + [2.0], abs=1e-5)


def gradient(group):
    config = GRPOConfig(credit="trajectory")
    trajectories = group.trajectories
    samples, _ = build_samples(trajectories, grpo_advantages([group], config)[0], 64)
    batch = collate(samples, 0)
    logp = torch.full(batch["input_ids"].shape, -1.0, requires_grad=True)
    loss, _ = policy_objective(logp, logp.detach(), batch["sampler_logprobs"], batch["advantages"],
                               batch["loss_mask"], None, CONFIG, guide_mask=batch["guide_mask"], shaping=0.1,
                               relabel_mask=batch["relabel_mask"])
    loss.backward()
    return logp.grad, batch


def test_a_group_without_success_gets_a_gradient_only_once_guided():
    group = failing_group()
    grad, _ = gradient(group)
    assert float(grad.abs().sum()) == 0.0  # on-policy alone: every advantage 0, nothing to learn
    guided = with_guides(group, [as_guide(demonstration(), group, 0)])
    grad, batch = gradient(guided)
    trained = batch["loss_mask"].bool()
    guide_rows = batch["guide_mask"].bool().any(-1)
    assert guide_rows.tolist() == [False] * 4 + [True]
    assert (grad[guide_rows][trained[guide_rows]] < 0).all()  # the guide's tokens made likelier
    assert (grad[~guide_rows][trained[~guide_rows]] > 0).all()  # the failed rollouts' made less likely


def test_a_guide_of_another_task_is_refused():
    group = failing_group()
    with pytest.raises(InvalidArgument, match="not of the group's task 't'"):
        as_guide(demonstration(task="other"), group, 0)
    with pytest.raises(InvalidArgument, match="is not a guide of the group's task"):
        with_guides(group, [demonstration()])  # not marked as a guide: never mixed in as on-policy


def test_guidance_settings_are_validated():
    with pytest.raises(InvalidArgument, match="source"):
        Guidance(source="oracle")
    with pytest.raises(InvalidArgument, match="below"):
        Guidance(below=2)
    with pytest.raises(InvalidArgument, match="distill_beta"):
        GRPOConfig(distill_beta=-1)
    assert GRPOConfig(guidance=Guidance(k=3)).to_dict()["guidance"]["k"] == 3


def test_the_config_says_which_of_its_settings_ask_for_a_teacher():
    assert GRPOConfig().teacher_settings() == ()
    assert GRPOConfig(distill_beta=0.0, relabel_weight=0.0).teacher_settings() == ()
    assert GRPOConfig(guidance=Guidance(source="demonstrations"), relabel_weight=0.5).teacher_settings() == (
        "Guidance(source='demonstrations')", "relabel_weight")
    assert GRPOConfig(distill_beta=1.0).teacher_settings() == ("distill_beta",)
