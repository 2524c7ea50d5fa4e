"""Multi-turn GRPO with per-step credit: an episode-level advantage (each rollout's return
against the other rollouts of its task, or with `baseline='batch'` every rollout of the
iteration) plus, with `credit='anchor'`, a step-level one within anchor-state groups (steps taken
from the same observation, wherever they occur), on a clipped surrogate.

    episode   A_ep = (R - mean R) / std R                  R = the rollout's total reward
    step      A_st = (Q(s, a) - V(s)) / std_s             G_t = r_t + gamma * G_{t+1}, grouped by state s
    advantage A_t  = A_ep + step_weight * A_st           (A_ep alone on a step with no sibling)
    token     A_t + span_weight * the span rewards it lies in (span_baseline='group': minus their key's mean)
    loss      clipped surrogate on each completion token, + kl_beta * KL to the reference

With a teacher (`trainer/teacher.py`): guide trajectories join failed groups before the
advantages (their tokens shaped, not clipped), distillation adds distill_beta * (log pi_teacher -
log pi_student) to each sampled token's advantage, and relabelled states add an imitation term.
"""

from __future__ import annotations

import time
from typing import Hashable, Sequence

import torch

from forge_bridge.core.types import Trajectory, TrajectoryGroup, Transition
from forge_bridge.policies.base import DEFAULT_SLOT
from forge_bridge.trainer.advantages import (
    all_token_advantages,
    anchor_step_advantages,
    centre_span_rewards,
    combine,
    discounted_returns,
    episode_advantages,
    span_rewards,
    step_rewards,
)
from forge_bridge.trainer import teacher as teaching
from forge_bridge.trainer.batch import BatchStats, Sample, build_samples, trained_tokens_per_step
from forge_bridge.trainer.config import GRPOConfig, OfflineConfig
from forge_bridge.trainer.loop import Trainer
from forge_bridge.trainer.losses import policy_objective
from forge_bridge.trainer.offline import train_offline
from forge_bridge.trainer.teacher import Teacher, check_teacher


def state_key(traj: Trajectory, t: int) -> Hashable:
    """The observation step t acted on: the user's `info['state_key']` when the front end set
    one, else the exact prompt token ids (a step without tokens matches nothing)."""
    step: Transition = traj.transitions[t]
    if "state_key" in step.info:
        return ("state", str(step.info["state_key"]))
    return ("prompt", tuple(step.prompt_token_ids)) if step.prompt_token_ids else ("alone", traj.id, t)


def action_key(step: Transition) -> Hashable:
    """What was done there: the exact completion token ids (else the parsed action)."""
    if step.completion_token_ids:
        return tuple(step.completion_token_ids)
    return (step.action.content, tuple((c.name, c.arguments) for c in step.action.tool_calls))


def _pools(groups: Sequence[TrajectoryGroup], baseline: str) -> list[list[tuple[int, int]]]:
    """(group, trajectory) indices compared with each other: each group, or each role's batch."""
    if baseline == "group":
        return [[(g, i) for i in range(len(group))] for g, group in enumerate(groups)]
    pools: dict[str | None, list[tuple[int, int]]] = {}
    for g, group in enumerate(groups):
        pools.setdefault(group.role, []).extend((g, i) for i in range(len(group)))
    return list(pools.values())


def grpo_advantages(groups: Sequence[TrajectoryGroup], config: GRPOConfig) -> list[list[torch.Tensor]]:
    """Per-step advantages: one [S] tensor per trajectory, nested as `groups` is."""
    out = [[torch.zeros(0)] * len(group) for group in groups]
    for pool in _pools(groups, config.baseline):
        trajs = [groups[g].trajectories[i] for g, i in pool]
        rewards = [step_rewards([s.reward for s in t.transitions], t.reward) for t in trajs]
        episode = episode_advantages([float(r.sum()) for r in rewards], config.scale_by_std)  # [N]
        if config.credit == "anchor":
            step, sibling = anchor_step_advantages(
                [discounted_returns(r, config.gamma) for r in rewards],
                [[state_key(t, k) for k in range(len(t.transitions))] for t in trajs],
                [[action_key(s) for s in t.transitions] for t in trajs], config.scale_by_std)
        else:
            step = sibling = [torch.zeros(len(t.transitions)) for t in trajs]
        for n, (g, i) in enumerate(pool):
            out[g][i] = combine(episode[n], step[n], sibling[n].bool(), config.step_weight)
    return out


def grpo_span_rewards(groups: Sequence[TrajectoryGroup], config: GRPOConfig) -> list[list[list[list]]]:
    """The span rewards trained on, per trajectory per step, nested as `groups` is: as recorded,
    or with `span_baseline='group'` centred per key within each pool `grpo_advantages` compares."""
    out = [[[span_rewards(s) for s in t.transitions] for t in group.trajectories] for group in groups]
    if config.span_baseline == "group":
        for pool in _pools(groups, config.baseline):
            for (g, i), centred in zip(pool, centre_span_rewards([out[g][i] for g, i in pool])):
                out[g][i] = centred
    return out


def has_span_signal(spans: Sequence[Sequence[Sequence]]) -> bool:
    """Whether a group's rollouts (`spans[i][t]`: rollout i, step t) differ in their span rewards,
    the (key, value) pairs in recorded order, and one value is nonzero: rollouts rewarded alike
    say nothing against each other (+1 on argument a in one and on b in the other do differ)."""
    rewarded = [tuple((span[3] if len(span) > 3 else None, float(span[2])) for step in rollout for span in step)
                for rollout in spans]
    return len(set(rewarded)) > 1 and any(value != 0 for pairs in rewarded for _, value in pairs)


class GRPOTrainer(Trainer):
    """GRPO; with a `teacher` (`trainer/teacher.py`), guided groups, distillation and relabelling."""

    config: GRPOConfig
    learns_offline = True
    """`train_offline` may run this trainer's objective on recorded episodes (PPO's value head may not)."""

    def __init__(self, policy, config: GRPOConfig, *, teacher: Teacher | None = None, **kwargs) -> None:
        super().__init__(policy, config, **kwargs)
        self.teacher: Teacher | None = None
        """Who guides the policy where it fails (None: on-policy GRPO alone)."""
        if teacher is not None:
            self.use_teacher(teacher)

    def run_iteration(self, rollout, tasks, it: int) -> dict:
        """Iteration `it` (0-based): the recipe, top to bottom."""
        t0 = time.perf_counter()
        groups, metrics = self.collect(rollout, self.tasks_for(tasks, it), it)  # the agent's rollouts (+ guides)
        t1, trained_tokens = time.perf_counter(), 0
        for slot, mine in self.by_slot(groups):  # each LoRA on its own roles' groups
            with self.learner.training(slot):
                samples, batch, stats = self.prepare(mine)  # advantages -> token samples
                self.record_credit(mine, trained_tokens_per_step(samples), it + 1)
                stats |= self.update(samples) if samples else {}  # epochs x minibatches: forward, objective, step
            trained_tokens += batch.trained_tokens
            stats |= batch.metrics()
            metrics |= stats if len(self.learner.slots) == 1 else {f"{slot}/{k}": v for k, v in stats.items()}
        t2 = time.perf_counter()
        versions = self.publish_all(it + 1)  # the live policy serves v(it + 1) from its next call
        metrics = self.timed({"iteration": it + 1, "version": versions[DEFAULT_SLOT], **{
            f"version_{slot}": v for slot, v in versions.items() if slot != DEFAULT_SLOT}, **metrics},
            t0, t1, t2, trained_tokens)
        self.end_iteration(metrics)  # metrics.jsonl, TensorBoard, a checkpoint
        return metrics

    def prepare(self, groups: list[TrajectoryGroup]) -> tuple[list[Sample], BatchStats, dict]:
        """The groups' advantages, the teacher's signals, and the token samples they make."""
        advantages = grpo_advantages(groups, self.config)
        spans = grpo_span_rewards(groups, self.config)
        self.remember_advantages([t for g in groups for t in g.trajectories], [a for advs in advantages for a in advs])
        # a group whose every advantage is 0 says nothing against its own rollouts (unless its
        # span rewards differ: they still tell right parts of a call from wrong ones)
        signal = [any(a.numel() > 0 and float(a.abs().max()) > 1e-6 for a in advs)
                  or (self.config.span_weight > 0 and has_span_signal(sp))
                  for advs, sp in zip(advantages, spans)]
        # distillation's per-token reward is a signal of its own, in every group
        skip = self.config.skip_uniform_groups
        skip = self.config.loss.kl_beta == 0 if skip is None else skip
        skip = skip and self.config.baseline == "group" and self.config.distill_beta == 0
        keep = signal if skip else [True] * len(groups)
        kept = [g for g, k in zip(groups, keep) if k]
        trajectories = [t for group in kept for t in group.trajectories]
        flat = [a for advs, k in zip(advantages, keep) if k for a in advs]
        flat_spans = [sp for group_spans, k in zip(spans, keep) if k for sp in group_spans]
        relabelled, taught = self.teach(groups)
        distilled = None
        if self.config.distill_beta > 0:
            distilled, taught["distill_log_ratio"] = teaching.distillation_token_rewards(
                trajectories, self.step_teacher, self.config.distill_beta)
        tokens = all_token_advantages(trajectories, flat, self.config.span_weight, flat_spans, distilled)
        samples, stats = build_samples(trajectories, tokens, self.config.max_seq_len, self.config.merge_steps)
        samples += relabelled
        first = [float(a[0]) for a, t in zip(flat, trajectories) if len(a) and t.behaviour == "policy"]
        uniform = len(groups) - sum(signal)
        return samples, stats, {"groups_trained": sum(signal), "groups_uniform": uniform,
                                "zero_signal_share": uniform / len(groups) if groups else 1.0,
                                "advantage_abs_mean_step0": sum(map(abs, first)) / max(len(first), 1), **taught}

    def objective(self, logp, hidden, batch):
        """GRPO's loss on one microbatch (`losses.policy_objective`)."""
        guidance = self.config.guidance
        return policy_objective(logp, self.old_logprobs(logp, batch), batch["sampler_logprobs"], batch["advantages"],
                                batch["loss_mask"], self.reference_logprobs(batch), self.config.loss,
                                guide_mask=batch.get("guide_mask"), shaping=guidance.shaping if guidance else 0.1,
                                relabel_mask=batch.get("relabel_mask"), relabel_weight=self.config.relabel_weight)

    # ------------------------------------------------------------------ the teacher
    def use_teacher(self, teacher: Teacher) -> None:
        """Guide with this teacher from the next iteration (e.g. once the warm start recorded
        the demonstrations it draws guides from); one that cannot give what the config asks
        (`guidance`, `distill_beta`, `relabel_weight`) is refused, naming what is missing."""
        check_teacher(teacher, self.config, self.tokenizer)
        self.teacher = teacher

    def train(self, rollout, tasks, iterations, *, resume=False, **validation):
        if not self.follower:  # the leader collects; a follower has no teacher to check
            check_teacher(self.teacher, self.config, self.tokenizer)  # before any rollout: nothing runs without one
        return super().train(rollout, tasks, iterations, resume=resume, **validation)

    def collect(self, rollout, tasks, it):
        """The policy's own rollouts (the metrics are theirs alone), then guides for the groups it failed."""
        groups, stats = super().collect(rollout, tasks, it)
        if self.config.guidance is None:
            return groups, stats
        groups, guided = teaching.guide(self, groups, tasks, it)
        return groups, {**stats, **guided}

    def teach(self, groups: list[TrajectoryGroup]) -> tuple[list[Sample], dict]:
        """The teacher's signals on the policy's own trajectories, every group's (a group that
        failed alike is where they matter most): the teacher's log-probabilities of their tokens
        (`step_teacher`, for distillation) and relabelled samples."""
        trajectories = [t for g in groups for t in g.trajectories]
        samples: list[Sample] = []
        stats: dict = {}
        self.step_teacher = {}
        if self.config.distill_beta <= 0 and self.config.relabel_weight <= 0:
            return samples, stats
        assert self.teacher is not None and self.teacher.policy is not None  # check_teacher refuses it otherwise
        teacher = self.teacher.policy
        if self.config.distill_beta > 0:
            self.step_teacher, failed = teaching.teacher_logprobs(teacher, trajectories)
            stats["distill_unscored_steps"] = failed
        if self.config.relabel_weight > 0:
            acting = teaching.acting_policy(teacher, self.tokenizer, getattr(self.policy, "tool_format", "auto"))
            samples, relabelled = teaching.relabel_samples(acting, trajectories, self.config.rollout.success_threshold,
                                                          self.config.max_seq_len, self.config.rollout.concurrency)
            stats |= relabelled
        return samples, stats

    def train_offline(self, store, config: OfflineConfig | None = None, **options) -> dict:
        """One iteration learned from episodes recorded outside the loop, with their feedback
        (`trainer/offline.py`); returns its metrics."""
        return train_offline(self, store, config or OfflineConfig(), **options)


__all__ = ["GRPOTrainer", "action_key", "grpo_advantages", "grpo_span_rewards", "state_key"]
