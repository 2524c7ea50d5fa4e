"""Policy-gradient losses over token-level tensors (pure functions).

Shapes: B sequences of T positions; `mask` [B, T] is 1 on completion tokens the loss trains on.
`logp` are the current policy's log-probabilities of the taken tokens, `old_logp` those of the
policy before the update (pi_old, computed by the trainer), `sampler_logp` those recorded when the
tokens were sampled (by vLLM or the embedded policy), all at the sampling temperature.
"""

from __future__ import annotations

from typing import Any

import torch

from forge_bridge.core.errors import InvalidArgument


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token") -> torch.Tensor:
    """Mean over masked tokens: `token` weighs every token alike (long answers count more);
    `sequence` averages within each sequence first, then over sequences.  [B, T] -> scalar."""
    mask = mask.to(per_token.dtype)
    if mode == "token":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if mode == "sequence":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
        has_tokens = (mask.sum(-1) > 0).to(per_token.dtype)  # [B]
        return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1)
    raise InvalidArgument(f"mode: expected 'token' or 'sequence', got {mode!r}")


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                        is_weights: torch.Tensor | None = None, mode: str = "token"
                        ) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), r = exp(logp -
    old_logp) against the policy before this update (pi_old, as the trainer computes it), each
    token weighted by `is_weights` (the truncated importance weights of `tis_weights`; None: 1).
    All inputs [B, T] -> (scalar loss, stats)."""
    ratio = torch.exp(logp - old_logp)  # [B, T]
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)  # [B, T]
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = aggregate(per_token, mask, mode)
    m = mask.bool()
    with torch.no_grad():
        was_clipped = (clipped < unclipped) & m  # the clipped term is active: no gradient there
        stats = {"clip_fraction": float(was_clipped.sum() / m.sum().clamp(min=1)),
                 "ratio_mean": float(ratio[m].mean()) if m.any() else 1.0}
    return loss, stats


def tis_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling: min(pi_old / pi_sampler, cap) per token, without gradient.
    It corrects for the sampler (vLLM in bf16, the embedded policy's batch) not being exactly the
    trainer's pi_old; 1 where they agree.  [B, T] -> [B, T]."""
    with torch.no_grad():
        return torch.clamp(torch.exp(old_logp - sampler_logp), max=cap)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate k3 = exp(d) - d - 1 with d = ref_logp - logp:
    unbiased, always >= 0.  [B, T] -> [B, T]."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0.5 * (V - R)^2 over masked entries.  values, returns, mask: [B, S] -> scalar."""
    return 0.5 * aggregate((values - returns) ** 2, mask, "token")


def policy_objective(logp: torch.Tensor, old_logp: torch.Tensor, sampler_logp: torch.Tensor,
                     advantages: torch.Tensor, mask: torch.Tensor, ref_logp: torch.Tensor | None,
                     config: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """The whole policy objective GRPO and PPO train: the clipped surrogate of `clipped_policy_loss`
    on each token, weighted by the truncated importance weight min(pi_old / pi_sampler,
    `config.tis_cap`) (None: 1), plus `config.kl_beta` times the k3 KL to the reference
    (`ref_logp`; needed only when kl_beta > 0). Without a KL term the KL to the sampler is
    logged instead (a cheap drift gauge). `config`: a TrainerConfig (clip_low, clip_high,
    tis_cap, kl_beta, loss_aggregation).

    logp, old_logp, sampler_logp, advantages, mask, ref_logp: [B, T] -> (scalar loss, stats:
    clip_fraction, ratio_mean, sampler_logp_gap, tis_weight_mean, kl)."""
    mode = config.loss_aggregation
    weights = None if config.tis_cap is None else tis_weights(old_logp, sampler_logp, config.tis_cap)
    loss, stats = clipped_policy_loss(logp, old_logp, advantages, mask, config.clip_low, config.clip_high,
                                      weights, mode)
    m = mask.bool()
    with torch.no_grad():
        stats["sampler_logp_gap"] = float((old_logp - sampler_logp)[m].abs().mean()) if m.any() else 0.0
        if weights is not None:
            stats["tis_weight_mean"] = float(weights[m].mean()) if m.any() else 1.0
    if config.kl_beta > 0:
        if ref_logp is None:
            raise InvalidArgument("policy_objective: kl_beta > 0 needs the reference's log-probabilities (ref_logp)")
        kl = aggregate(kl_k3(logp, ref_logp), mask, mode)
        stats["kl"] = float(kl.detach())
        return loss + config.kl_beta * kl, stats
    with torch.no_grad():
        stats["kl"] = float(aggregate(kl_k3(logp, sampler_logp), mask))
    return loss, stats
