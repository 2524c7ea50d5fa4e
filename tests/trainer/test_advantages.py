"""Advantage math against values worked out by hand."""

import pytest
import torch

from forge_bridge.trainer.advantages import discounted_returns, gae, group_advantages, step_rewards


def close(a, b):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=1e-5)


def test_outcome_reward_lands_on_the_last_step_and_is_discounted_backwards():
    r = step_rewards([0.0, 0.5, 0.0], outcome=1.0)
    assert close(r, [0.0, 0.5, 1.0])
    # G2 = 1; G1 = 0.5 + 0.9 * 1 = 1.4; G0 = 0 + 0.9 * 1.4 = 1.26
    assert close(discounted_returns(r, 0.9), [1.26, 1.4, 1.0])
    assert close(discounted_returns(r, 0.0), r)
    assert close(discounted_returns(r, 1.0), [1.5, 1.5, 1.0])


def test_group_normalisation_per_step():
    returns = [torch.tensor([0.9, 1.0]), torch.tensor([0.0, 0.0]), torch.tensor([0.0])]
    adv = group_advantages(returns, scale_by_std=False)
    # step 0: mean of (0.9, 0, 0) = 0.3 -> 0.6, -0.3, -0.3; step 1: mean of (1, 0) = 0.5 -> 0.5, -0.5
    assert close(adv[0], [0.6, 0.5]) and close(adv[1], [-0.3, -0.5]) and close(adv[2], [-0.3])
    scaled = group_advantages(returns, scale_by_std=True)
    std0 = torch.tensor([0.9, 0.0, 0.0]).std(unbiased=False)
    assert close(scaled[0][0], 0.6 / std0) and close(scaled[0][1], 1.0)  # step 1: 0.5 / 0.5


def test_identical_rewards_give_zero_advantage_and_no_nan():
    adv = group_advantages([torch.tensor([1.0, 1.0])] * 4)
    assert all(torch.equal(a, torch.zeros(2)) for a in adv)
    (alone,) = group_advantages([torch.tensor([3.0])])
    assert torch.equal(alone, torch.zeros(1))


def test_gae_matches_a_plain_loop_reference():
    torch.manual_seed(0)
    rewards, values = torch.randn(6), torch.randn(6)
    gamma, lam, bootstrap = 0.9, 0.8, 0.3
    expected = []
    for t in range(6):  # A_t = sum_k (gamma*lam)^k delta_{t+k}
        total = 0.0
        for k in range(t, 6):
            nxt = values[k + 1] if k + 1 < 6 else bootstrap
            delta = rewards[k] + gamma * nxt - values[k]
            total += (gamma * lam) ** (k - t) * float(delta)
        expected.append(total)
    adv, ret = gae(rewards, values, gamma, lam, bootstrap=bootstrap)
    assert close(adv, expected) and close(ret, torch.tensor(expected) + values)


def test_gae_with_lambda_one_is_the_discounted_return_minus_the_value():
    rewards, values = torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.2, 0.4, 0.6])
    adv, _ = gae(rewards, values, 0.9, 1.0)
    assert close(adv, discounted_returns(rewards, 0.9) - values)


def test_per_step_credit_goes_to_the_early_call_that_decided_success():
    """Four rollouts of a 3-step task: step 0 picks the right or the wrong tool; steps 1-2 are
    the same routine in every rollout; only the right tool leads to success (reward 1)."""
    gamma = 0.9
    rollouts = [step_rewards([0, 0, 0], outcome=o) for o in (1.0, 1.0, 0.0, 0.0)]
    returns = [discounted_returns(r, gamma) for r in rollouts]
    adv = group_advantages(returns, scale_by_std=False)
    # G_0 = 0.81 for a success, 0 for a failure: step 0 gets +-0.405, the step that chose the tool.
    print("step-0 advantages:", [round(float(a[0]), 3) for a in adv])
    assert close([a[0] for a in adv], [0.405, 0.405, -0.405, -0.405])
    assert close([a[2] for a in adv], [0.5, 0.5, -0.5, -0.5])
    # With gamma, the decisive early step is credited, discounted by its distance to the outcome.
    assert float(adv[0][0]) == pytest.approx(gamma ** 2 * 0.5)
