"""Loss functions against values worked out by hand."""

import math

import pytest
import torch

from forge_bridge.trainer.config import GRPOConfig, LossConfig
from forge_bridge.trainer.losses import (
    aggregate,
    kl_k3,
    policy_objective,
    tis_weights,
    value_loss,
)


def objective(logp, old, advantages, mask, sampler=None, **settings):
    """The objective the trainer runs, on the policy's own tokens, without a KL term; the sampler
    is pi_old unless given (a truncated importance weight of 1)."""
    config = GRPOConfig(kl_beta=0.0, **settings).loss  # the flat names read into the nested LossConfig
    return policy_objective(logp, old, old if sampler is None else sampler, advantages, mask, None, config)


def close(a, b):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=1e-5)


def test_clip_boundaries_and_the_mask():
    # ratios 1.5, 0.5, 1.1, 3.0 (the last one masked out); advantages +1, +1, -1, +1
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 3.0]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, stats = objective(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    # token 0: min(1.5, 1.2) = 1.2; token 1: min(0.5, 0.8) = 0.5; token 2: min(-1.1, -1.1) = -1.1
    assert loss.item() == pytest.approx(-(1.2 + 0.5 - 1.1) / 3, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(1 / 3)


def test_asymmetric_clip():
    logp = torch.log(torch.tensor([[1.5, 0.5]]))
    loss, _ = objective(logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2),
                        clip_low=0.1, clip_high=0.3)
    # token 0: min(1.5, 1.3) = 1.3; token 1: min(-0.5, -0.9) = -0.9
    assert loss.item() == pytest.approx(-(1.3 - 0.9) / 2, abs=1e-6)


def test_gradient_vanishes_outside_the_clip_range():
    logp = torch.log(torch.tensor([[1.5]])).requires_grad_()
    loss, _ = objective(logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    loss.backward()
    assert logp.grad.item() == 0.0


def test_truncated_importance_weights_by_hand():
    # pi_old / pi_sampler per token: e^0 = 1 (they agree), e^ln 1.5 = 1.5, e^ln 4 = 4 -> capped at 2
    sampler = torch.log(torch.tensor([[0.2, 0.2, 0.1]]))
    old = torch.log(torch.tensor([[0.2, 0.3, 0.4]]))
    assert close(tis_weights(old, sampler, cap=2.0), [[1.0, 1.5, 2.0]])
    assert close(tis_weights(sampler, sampler, cap=2.0), [[1.0, 1.0, 1.0]])


def test_the_ratio_is_against_pi_old_and_the_tis_weight_scales_each_token():
    # current = old: r = 1, per token -A * w; A = -1 on both, w = pi_old / pi_sampler = (1, 2)
    # -> (1 + 2) / 2 = 1.5
    logp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.5, 0.25]]))
    loss, stats = objective(logp, logp.detach(), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2), sampler=sampler,
                            tis_cap=4.0)
    assert loss.item() == pytest.approx(1.5) and stats["ratio_mean"] == pytest.approx(1.0)
    loss.backward()  # d/dlogp of -r A w / 2 with r = 1: -A w / 2 = (0.5, 1.0); the weight has no gradient
    assert close(logp.grad, [[0.5, 1.0]])


def test_token_and_sequence_aggregation():
    x = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(x, mask, "token").item() == pytest.approx(7 / 4)
    assert aggregate(x, mask, "sequence").item() == pytest.approx((1 + 4) / 2)
    with pytest.raises(ValueError, match="mode"):
        aggregate(x, mask, "batch")


def test_k3_kl():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    d = math.log(0.25) - math.log(0.5)
    assert kl_k3(logp, ref).item() == pytest.approx(math.exp(d) - d - 1)
    assert kl_k3(ref, ref).item() == 0.0


def test_value_loss():
    values, returns = torch.tensor([[1.0, 3.0, 9.0]]), torch.tensor([[0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third entry is padding
    assert value_loss(values, returns, mask).item() == pytest.approx(0.5 * (1 + 4) / 2)


def test_the_whole_objective_by_hand():
    # two trained tokens (the third is masked out): ratios 1.2 and 0.5 against pi_old, TIS
    # weights pi_old / pi_sampler = 2 -> capped at 1.5, and 1; advantages +1, -1; clip 0.2
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    logp = torch.log(torch.tensor([[0.6, 0.25, 0.9]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.25, 0.5, 0.1]]))
    ref = torch.log(torch.tensor([[0.3, 0.5, 0.2]]))
    adv, mask = torch.tensor([[1.0, -1.0, 1.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    config = LossConfig(tis_cap=1.5, kl_beta=0.1)
    loss, stats = policy_objective(logp, old, sampler, adv, mask, ref, config)
    # token 0: -min(1.2, 1.2) * 1.5 = -1.8; token 1: -min(-0.5, -0.8) * 1 = 0.8 (clipped)
    surrogate = (-1.8 + 0.8) / 2
    # k3 with d = ref - logp: d0 = ln 0.5 -> 0.5 - ln 0.5 - 1; d1 = ln 2 -> 2 - ln 2 - 1
    kl = ((0.5 - math.log(0.5) - 1) + (2 - math.log(2) - 1)) / 2
    assert loss.item() == pytest.approx(surrogate + 0.1 * kl, abs=1e-6)
    assert stats["kl"] == pytest.approx(kl, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    assert stats["tis_weight_mean"] == pytest.approx(1.25)
    assert stats["sampler_logp_gap"] == pytest.approx(math.log(2) / 2, abs=1e-6)
    loss.backward()
    # d/dlogp: surrogate -A r w / 2 (0 where clipped) + beta (1 - e^d) / 2
    assert close(logp.grad, [[-1.2 * 1.5 / 2 + 0.1 * 0.5 / 2, 0.1 * (1 - 2) / 2, 0.0]])


def test_the_objective_without_a_kl_term_logs_the_kl_to_the_sampler_and_needs_no_reference():
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    sampler = torch.log(torch.tensor([[0.25, 0.5]]))
    config = LossConfig(tis_cap=None, kl_beta=0.0)
    loss, stats = policy_objective(old, old, sampler, torch.ones(1, 2), torch.ones(1, 2), None, config)
    assert loss.item() == pytest.approx(-1.0) and "tis_weight_mean" not in stats
    # k3(pi, sampler) with d = ln 0.5 on token 0, 0 on token 1
    assert stats["kl"] == pytest.approx((0.5 - math.log(0.5) - 1) / 2, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_objective(old, old, sampler, torch.ones(1, 2), torch.ones(1, 2), None, LossConfig(kl_beta=0.1))
    with pytest.raises(TypeError, match="expected a LossConfig"):  # a whole trainer config is not its loss part
        policy_objective(old, old, sampler, torch.ones(1, 2), torch.ones(1, 2), None, GRPOConfig())
