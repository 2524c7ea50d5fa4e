"""Multi-turn PPO: GAE over steps, with a value head trained beside the LoRA.

    values    V(s_t) read by a linear head at the last prompt token of step t (the same network
              that acts: a second critic model would not fit a small CPU budget)
    advantage A_t = GAE(gamma, lambda) over the steps of each trajectory
    loss      clipped surrogate on each completion token + value_coef * 0.5 (V - (A + V))^2
"""

from __future__ import annotations

from typing import Sequence

import torch

from forge_bridge.core.types import Trajectory
from forge_bridge.trainer.advantages import gae, step_rewards
from forge_bridge.trainer.batch import build_samples, collate
from forge_bridge.trainer.config import PPOConfig
from forge_bridge.trainer.logprobs import token_logprobs
from forge_bridge.trainer.loop import Trainer
from forge_bridge.trainer.losses import value_loss


def read_values(head: torch.nn.Module, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """hidden [B, T, H], positions [B, S] -> values [B, S]."""
    picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, S, H]
    return head(picked.float()).squeeze(-1)


def ppo_advantages(trajectories: Sequence[Trajectory], values: Sequence[torch.Tensor], config: PPOConfig
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GAE per trajectory from its step rewards (the outcome on the last step) and values [S_i];
    returns (advantages, value targets), one [S_i] tensor each; whitened over the batch when
    `normalize_advantages`."""
    advantages, targets = [], []
    for t, v in zip(trajectories, values):
        a, target = gae(step_rewards([s.reward for s in t.transitions], t.reward), v, config.gamma, config.lam)
        advantages.append(a)
        targets.append(target)
    if config.normalize_advantages and advantages:
        flat = torch.cat(advantages)
        if flat.numel() > 1 and flat.std() > 1e-6:
            advantages = [(a - flat.mean()) / (flat.std() + 1e-6) for a in advantages]
    return advantages, targets


class PPOTrainer(Trainer):
    config: PPOConfig

    def _extra_modules(self, hidden_size: int) -> dict[str, torch.nn.Module]:
        head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        return {"value_head": head}

    def _param_groups(self) -> list[dict]:
        return super()._param_groups() + [{"params": list(self.extra_modules["value_head"].parameters()),
                                           "lr": self.config.value_lr}]

    def _step_values(self, trajs) -> dict[tuple[str, int], float]:
        zeros = [torch.zeros(len(t.transitions)) for t in trajs]
        samples, _ = build_samples(trajs, zeros, self.config.max_seq_len, merge=False)
        values: dict[tuple[str, int], float] = {}
        with torch.no_grad():
            size = self.config.microbatch_size or self.config.minibatch_size
            for start in range(0, len(samples), size):
                chunk = samples[start:start + size]
                batch = collate(chunk, self.pad_id)
                with self.autocast():
                    _, hidden, _ = token_logprobs(self.model, batch["input_ids"], batch["attention_mask"],
                                                  batch["loss_mask"])
                v = read_values(self.extra_modules["value_head"], hidden, batch["value_positions"])
                for b, sample in enumerate(chunk):
                    for k, step in enumerate(sample.steps):
                        values[step] = float(v[b, k])
        return values

    def prepare(self, groups):
        trajs = [t for group in groups for t in group.trajectories]
        values = self._step_values(trajs)
        per_step = [torch.tensor([values.get((t.id, i), 0.0) for i in range(len(t.transitions))]) for t in trajs]
        advs, rets = ppo_advantages(trajs, per_step, self.config)
        samples, stats = build_samples(trajs, advs, self.config.max_seq_len, self.config.merge_steps,
                                       step_returns=rets)
        return samples, stats, {"value_mean": sum(values.values()) / max(len(values), 1)}

    def loss(self, logp, hidden, batch):
        loss, stats = self.policy_loss(logp, batch)
        values = read_values(self.extra_modules["value_head"], hidden, batch["value_positions"])
        vloss = value_loss(values, batch["returns"], batch["value_mask"])
        stats["value_loss"] = float(vloss.detach())
        return loss + self.config.value_coef * vloss, stats


__all__ = ["PPOTrainer", "ppo_advantages", "read_values"]
