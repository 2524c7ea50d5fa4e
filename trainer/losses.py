"""Policy-gradient losses over token-level tensors (pure functions).

Shapes: B sequences of T positions; `mask` [B, T] is 1 on completion tokens the loss trains on.
`logp` are the current policy's log-probabilities of the taken tokens, `old_logp` those of the
policy before the update (pi_old, computed by the trainer), `sampler_logp` those recorded when the
tokens were sampled (by vLLM or the embedded policy), all at the sampling temperature.
"""

from __future__ import annotations

import torch

from forge_bridge.core.errors import InvalidArgument, WrongType
from forge_bridge.trainer.settings import LossConfig


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


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float = 0.2,
                      clip_high: float = 0.2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A),
    r = exp(logp - old_logp) against the policy before this update (pi_old).
    All inputs [B, T] -> (per-token loss, ratio, whether the clipped term was active) [B, T]."""
    ratio = torch.exp(logp - old_logp)  # [B, T]
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped), ratio, (clipped < unclipped).detach()


def shaping_weight(logp: torch.Tensor, shaping: float) -> torch.Tensor:
    """LUFFY's policy shaping of off-policy (guide) tokens: f(pi) = pi / (pi + c), c = `shaping`, pi =
    exp(logp) under the current policy. Its gradient, c / (pi + c)^2 * grad pi, is the
    plain likelihood's amplified up to 1/c on unlikely tokens (where grad pi = pi * grad log
    pi would barely move them), yet bounded (log pi's 1/pi is not).  [B, T] -> [B, T]."""
    p = torch.exp(logp)
    return p / (p + shaping)


def guide_policy_loss(logp: torch.Tensor, advantages: torch.Tensor, shaping: float) -> torch.Tensor:
    """Per-token loss on guide tokens, whose sampler is not the policy (no ratio to clip):
    -f(pi) * A with f = `shaping_weight`.  [B, T] -> [B, T]."""
    return -shaping_weight(logp, shaping) * advantages


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
                     config: LossConfig, *, guide_mask: torch.Tensor | None = None, shaping: float = 0.1,
                     relabel_mask: torch.Tensor | None = None, relabel_weight: float = 0.0
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """The whole policy objective GRPO and PPO train, per masked token by whose it is:

    - the policy's own tokens: the clipped surrogate of `clipped_surrogate`, weighted by the
      truncated importance weight min(pi_old / pi_sampler, `config.tis_cap`) (None: 1);
    - guide tokens (`guide_mask`, a teacher's or a demonstration's in a GRPO group):
      -f(pi) * A with f(pi) = pi / (pi + `shaping`) (`guide_policy_loss`; `Guidance.shaping`);
    - relabelled tokens (`relabel_mask`, the teacher's action at a state the policy failed
      from): -`relabel_weight` * log pi (imitation);

    averaged over every masked token (`config.aggregation`), plus `config.kl_beta` times the k3
    KL to the reference (`ref_logp`; needed only when kl_beta > 0) over the policy's own tokens.
    Without a KL term the KL to the sampler is logged instead (a cheap drift gauge).

    logp, old_logp, sampler_logp, advantages, mask, ref_logp, guide_mask, relabel_mask: [B, T] ->
    (scalar loss, stats: clip_fraction, ratio_mean, sampler_logp_gap, tis_weight_mean, kl, and
    guide_weight_mean where guide tokens are present)."""
    if not isinstance(config, LossConfig):
        raise WrongType(f"policy_objective: config: expected a LossConfig (a trainer config's .loss), "
                        f"got {type(config).__name__}")
    mode = config.aggregation
    mask = mask.float()
    guide = torch.zeros_like(mask) if guide_mask is None else guide_mask.float() * mask
    relabel = torch.zeros_like(mask) if relabel_mask is None else relabel_mask.float() * mask
    own = mask * (1 - guide) * (1 - relabel)  # [B, T]: the policy's own sampled tokens
    per_token, ratio, was_clipped = clipped_surrogate(logp, old_logp, advantages, config.clip_low, config.clip_high)
    weights = None if config.tis_cap is None else tis_weights(old_logp, sampler_logp, config.tis_cap)
    if weights is not None:
        per_token = per_token * weights
    per_token = per_token * own
    if guide.any():
        per_token = per_token + guide_policy_loss(logp, advantages, shaping) * guide
    if relabel.any():
        per_token = per_token - relabel_weight * logp * relabel
    loss = aggregate(per_token, mask, mode)
    m, g = own.bool(), guide.bool()
    with torch.no_grad():
        stats = {"clip_fraction": float((was_clipped & m).sum() / m.sum().clamp(min=1)),
                 "ratio_mean": float(ratio[m].mean()) if m.any() else 1.0,
                 "sampler_logp_gap": float((old_logp - sampler_logp)[m].abs().mean()) if m.any() else 0.0}
        if weights is not None:
            stats["tis_weight_mean"] = float(weights[m].mean()) if m.any() else 1.0
        if g.any():
            stats["guide_weight_mean"] = float(shaping_weight(logp, shaping)[g].mean())
    if config.kl_beta > 0:
        if ref_logp is None:
            raise InvalidArgument("policy_objective: kl_beta > 0 needs the reference's log-probabilities (ref_logp)")
        kl = aggregate(kl_k3(logp, ref_logp), own, mode)
        stats["kl"] = float(kl.detach())
        return loss + config.kl_beta * kl, stats
    with torch.no_grad():
        stats["kl"] = float(aggregate(kl_k3(logp, sampler_logp), own))
    return loss, stats
