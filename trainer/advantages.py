"""Per-step advantages over the model calls of multi-turn trajectories (pure functions).

A trajectory of S model calls has step rewards r_0..r_{S-1} (the outcome reward added to the
last step). The discounted return G_t = r_t + gamma * G_{t+1} gives an early step credit for
what follows it, discounted by how far the outcome is. GRPO compares each G_t with the other
rollouts of the same task; PPO uses GAE over steps with a value estimate per step. Each step's
advantage is then given to its completion tokens (`batch.build_samples`).
"""

from __future__ import annotations

from typing import Sequence

import torch


def step_rewards(rewards: Sequence[float], outcome: float | None) -> torch.Tensor:
    """[S] step rewards with the outcome reward added to the last step."""
    r = torch.tensor(list(rewards), dtype=torch.float32)  # [S]
    if outcome is not None and len(r) > 0:
        r[-1] += outcome
    return r


def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1}, G_S = 0.  rewards: [S] -> returns: [S]."""
    returns = torch.zeros_like(rewards)
    running = torch.tensor(0.0)
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


def group_advantages(returns: Sequence[torch.Tensor], scale_by_std: bool = True,
                     eps: float = 1e-6) -> list[torch.Tensor]:
    """GRPO within one task's group, per step index: A_{i,t} = (G_{i,t} - mean_j G_{j,t}) / std_j,
    over the rollouts j that reached step t. A step no other rollout reached, and a group whose
    returns are all equal, get advantage 0 (no signal, never NaN).

    returns: one [S_i] tensor per rollout -> one [S_i] tensor of advantages per rollout.
    """
    longest = max((len(g) for g in returns), default=0)
    out = [torch.zeros_like(g) for g in returns]
    for t in range(longest):
        members = [i for i, g in enumerate(returns) if len(g) > t]
        if len(members) < 2:
            continue
        column = torch.stack([returns[i][t] for i in members])  # [M]
        centred = column - column.mean()
        if scale_by_std:
            std = column.std(unbiased=False)
            centred = centred / (std + eps) if std > eps else torch.zeros_like(centred)
        for k, i in enumerate(members):
            out[i][t] = centred[k]
    return out


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float,
        bootstrap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over steps.

    rewards: [S], values: [S] (V(s_t) per step), bootstrap: V(s_S) after the last step (0 when
    the episode terminated; the value estimate when it was truncated).
    Returns (advantages [S], returns [S] = advantages + values, the value targets).
    """
    S = len(rewards)
    adv = torch.zeros(S, dtype=torch.float32)
    running = torch.tensor(0.0)
    for t in range(S - 1, -1, -1):
        next_value = values[t + 1] if t + 1 < S else torch.tensor(float(bootstrap))
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        adv[t] = running
    return adv, adv + values
