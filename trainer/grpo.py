"""Multi-turn GRPO: per-step discounted returns, normalised within each task's group."""

from __future__ import annotations

import torch

from forge_bridge.trainer.advantages import group_advantages
from forge_bridge.trainer.batch import build_samples
from forge_bridge.trainer.config import GRPOConfig
from forge_bridge.trainer.loop import Trainer
from forge_bridge.trainer.losses import aggregate, clipped_policy_loss, kl_k3


class GRPOTrainer(Trainer):
    config: GRPOConfig

    def prepare(self, groups):
        trajs, advs, skipped = [], [], 0
        for group in groups.values():
            if self.config.skip_uniform_groups and len({t.reward for t in group}) == 1:
                skipped += 1
                continue
            trajs += group
            advs += group_advantages(self._returns(group), self.config.scale_by_std)
        samples, stats = build_samples(trajs, advs, self.config.max_seq_len, self.config.merge_steps)
        first = [float(a[0]) for a in advs if len(a)]
        return samples, stats, {"groups_trained": len(groups) - skipped, "groups_uniform": skipped,
                                "advantage_abs_mean_step0": sum(map(abs, first)) / max(len(first), 1)}

    def loss(self, logp, hidden, batch):
        mask = batch["loss_mask"]
        loss, stats = clipped_policy_loss(logp, batch["old_logprobs"], batch["advantages"], mask,
                                          self.config.clip_low, self.config.clip_high,
                                          self.config.tis_cap, self.config.loss_aggregation)
        if self.config.kl_beta > 0:
            kl = aggregate(kl_k3(logp, self.reference_logprobs(batch)), mask, self.config.loss_aggregation)
            loss = loss + self.config.kl_beta * kl
            stats["kl"] = float(kl)
        else:  # cheap estimate against the behaviour policy, for the logs
            with torch.no_grad():
                stats["kl"] = float(aggregate(kl_k3(logp, batch["old_logprobs"]), mask))
        return loss, stats
