"""Multi-turn GRPO: per-step discounted returns, compared with the other rollouts of the same
task (or, with `baseline='batch'`, with every rollout of the iteration), on a clipped surrogate.

    returns   G_t = r_t + gamma * G_{t+1}            (the outcome reward on the last step)
    advantage A_t = (G_t - mean G_t) / std G_t       over the rollouts that reached step t
    loss      clipped surrogate on each completion token, + kl_beta * KL to the reference
"""

from __future__ import annotations

from typing import Sequence

import torch

from forge_bridge.core.types import TrajectoryGroup
from forge_bridge.trainer.advantages import discounted_returns, group_advantages, step_rewards
from forge_bridge.trainer.batch import build_samples
from forge_bridge.trainer.config import GRPOConfig
from forge_bridge.trainer.loop import Trainer


def grpo_advantages(groups: Sequence[TrajectoryGroup], config: GRPOConfig) -> list[list[torch.Tensor]]:
    """Per-step advantages: one [S] tensor per trajectory, nested as `groups` is. The baseline
    pool is each group ('group'), or every group of the same role ('batch': a crew's roles are
    scored apart)."""
    returns = [[discounted_returns(step_rewards([s.reward for s in t.transitions], t.reward), config.gamma)
                for t in group.trajectories] for group in groups]
    if config.baseline == "group":
        return [group_advantages(r, config.scale_by_std) for r in returns]
    pools: dict[str | None, list[tuple[int, int]]] = {}  # role -> (group, trajectory) indices
    for g, group in enumerate(groups):
        pools.setdefault(group.role, []).extend((g, i) for i in range(len(group)))
    out = [[torch.zeros(0)] * len(group) for group in groups]
    for members in pools.values():
        for (g, i), adv in zip(members, group_advantages([returns[g][i] for g, i in members],
                                                         config.scale_by_std)):
            out[g][i] = adv
    return out


class GRPOTrainer(Trainer):
    config: GRPOConfig

    def prepare(self, groups):
        skip = self.config.skip_uniform_groups and self.config.baseline == "group"
        kept = [g for g in groups if not (skip and len(set(g.rewards)) == 1)]  # no signal in them
        advantages = grpo_advantages(kept, self.config)
        trajectories = [t for group in kept for t in group.trajectories]
        flat = [a for group in advantages for a in group]
        samples, stats = build_samples(trajectories, flat, self.config.max_seq_len, self.config.merge_steps)
        first = [float(a[0]) for a in flat if len(a)]
        return samples, stats, {"groups_trained": len(kept), "groups_uniform": len(groups) - len(kept),
                                "advantage_abs_mean_step0": sum(map(abs, first)) / max(len(first), 1)}

    def loss(self, logp, hidden, batch):
        return self.policy_loss(logp, batch)


__all__ = ["GRPOTrainer", "grpo_advantages"]
