"""Multi-turn GRPO: per-step discounted returns, normalised within each task's group (or, with
`baseline='batch'`, over the iteration's rollouts)."""

from __future__ import annotations

from forge_bridge.trainer.advantages import group_advantages
from forge_bridge.trainer.batch import build_samples
from forge_bridge.trainer.config import GRPOConfig
from forge_bridge.trainer.loop import Trainer


class GRPOTrainer(Trainer):
    config: GRPOConfig

    def prepare(self, groups):
        skip = self.config.skip_uniform_groups and self.config.baseline == "group"
        kept = {key: group for key, group in groups.items()
                if not (skip and len({t.reward for t in group}) == 1)}
        if self.config.baseline == "group":
            pools = [[group] for group in kept.values()]
        else:  # one baseline per role (a crew's roles are scored apart), over all its tasks
            by_role: dict = {}
            for (_, role), group in kept.items():
                by_role.setdefault(role, []).append(group)
            pools = list(by_role.values())
        trajs, advs = [], []
        for pool in pools:
            members = [t for group in pool for t in group]
            trajs += members
            advs += group_advantages(self._returns(members), self.config.scale_by_std)
        samples, stats = build_samples(trajs, advs, self.config.max_seq_len, self.config.merge_steps)
        first = [float(a[0]) for a in advs if len(a)]
        return samples, stats, {"groups_trained": len(kept), "groups_uniform": len(groups) - len(kept),
                                "advantage_abs_mean_step0": sum(map(abs, first)) / max(len(first), 1)}

    def loss(self, logp, hidden, batch):
        return self.policy_loss(logp, batch)
