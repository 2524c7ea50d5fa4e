"""Training from the store: episodes recorded outside the training loop -- production traffic
through the gateway (`--upstream`) or `ForgeMiddleware(passthrough=True)`, or the student's own
recorded runs -- with the feedback that arrived for them or a judge's scores, become one
training iteration (`train_offline`).

- **Rewards**: `feedback_reward` of each episode's feedback (a crew role's trajectory reads its
  parent episode's), else the judge's score when a judge is given. An episode with neither is
  left out and counted (`offline_missing_reward`): never trained on as a 0.
- **Filtered imitation**: the good episodes (reward >= `threshold`) that are not the student's
  own samples (`upstream`, `demonstration`) are imitated with the SFT loss: what worked in
  production, already in the student's tokens.
- **Off-policy policy gradient**: the student's own recorded episodes (`policy`), each step with
  its episode's advantage against the batch, (r - mean) / std (the episodes do not share a task:
  there is no group to compare within), through the GRPO loss, whose truncated importance weight
  corrects for the adapter version that sampled them (their recorded log-probabilities).

The result is published as the next version, logged and checkpointed like any iteration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from forge_bridge.core.errors import InvalidArgument, Unsupported, WrongType
from forge_bridge.core.store import TrajectoryStore
from forge_bridge.core.types import TRAINABLE_ENDS, Trajectory, succeeded, success_rate
from forge_bridge.rewards.feedback import Combine, feedback_reward, mean
from forge_bridge.trainer.advantages import standardise
from forge_bridge.trainer.batch import build_samples
from forge_bridge.trainer.config import OfflineConfig
from forge_bridge.trainer.lora import save_adapter

if TYPE_CHECKING:
    from forge_bridge.rewards.judges import RubricJudge
    from forge_bridge.trainer.loop import Trainer


def rewards_of(store: TrajectoryStore, episodes: list[Trajectory], combine: Combine = mean,
               judge: "RubricJudge | None" = None) -> list[float | None]:
    """Each episode's reward: its (parent episode's) feedback, else the judge's score, else None."""
    parents = [t.metadata.get("parent", t.id) for t in episodes]
    events = store.feedback(set(parents))
    rewards = [feedback_reward(events.get(p, []), combine) for p in parents]
    if judge is not None:
        unjudged = [k for k, r in enumerate(rewards) if r is None]
        for k, score in zip(unjudged, judge.score_many([episodes[k] for k in unjudged])):
            rewards[k] = score
    return rewards


def batch_advantages(rewards: list[float]) -> list[float]:
    """(r - mean) / std over the batch; all 0 when the rewards do not differ. [N] -> [N]"""
    return standardise(torch.tensor(rewards, dtype=torch.float64)).tolist()


def train_offline(trainer: "Trainer", store: TrajectoryStore, config: OfflineConfig = OfflineConfig(), *,
                  combine: Combine = mean, judge: "RubricJudge | None" = None) -> dict:
    """One iteration learned from the episodes in `store` (see the module docstring); returns its
    metrics. Nothing to learn from (no episode with a reward, or none of a kind `config` trains)
    is an `InvalidArgument` naming the counts: a run is never silently left untrained."""
    from forge_bridge.trainer.sft import sft

    if not getattr(trainer, "learns_offline", False):
        raise Unsupported(f"train_offline: a {type(trainer).__name__} does not learn from recorded episodes; "
                          "use a GRPOTrainer (its policy objective needs no value estimates of these states)")
    if not isinstance(store, TrajectoryStore):
        raise WrongType(f"store: expected a TrajectoryStore, got {type(store).__name__}")
    trainer.ranks.check_local("train_offline")
    episodes = [t for t in store.iter(run_id=config.run_id, since=config.since, **(config.where or {}))
                if t.end_reason in TRAINABLE_ENDS and not t.excluded and t.transitions]
    rewards = rewards_of(store, episodes, combine, judge)
    scored = [(t, r) for t, r in zip(episodes, rewards) if r is not None]
    good = [t for t, r in scored if succeeded(r, config.threshold) and t.behaviour in ("upstream", "demonstration")]
    own = [(t, r) for t, r in scored if t.behaviour == "policy"]
    metrics: dict[str, Any] = {
        "offline_episodes": len(episodes), "offline_missing_reward": len(episodes) - len(scored),
        "offline_imitated": len(good) if config.imitate else 0, "offline_own": len(own) if config.reinforce else 0,
        "reward_mean": sum(r for _, r in scored) / max(len(scored), 1),
        "success_rate": success_rate([r for _, r in scored], config.threshold)}
    if not metrics["offline_imitated"] and not metrics["offline_own"]:
        raise InvalidArgument(
            f"train_offline: nothing to learn from in {store.path}: {len(episodes)} episodes, "
            f"{metrics['offline_missing_reward']} without feedback or a judge's score, {len(good)} good ones of "
            f"the agent's own model (imitate={config.imitate}), {len(own)} of the student's (reinforce={config.reinforce})")
    if metrics["offline_imitated"]:
        done = sft(trainer, good, config.sft)
        metrics.update(offline_sft_loss_first=done["sft_loss_first"], offline_sft_loss_last=done["sft_loss_last"])
    if metrics["offline_own"]:
        metrics.update(reinforce(trainer, own))
    return finish(trainer, metrics, config.publish)


def reinforce(trainer: "Trainer", own: list[tuple[Trajectory, float]]) -> dict:
    """The policy-gradient step on the student's own episodes, per LoRA slot."""
    advantages = batch_advantages([r for _, r in own])
    stats: dict[str, float] = {"offline_reinforced_steps": 0}
    by_slot: dict[str, list[tuple[Trajectory, float]]] = {}
    for (t, _), a in zip(own, advantages):
        by_slot.setdefault(trainer.slot_of_steps(t.role, [t]), []).append((t, a))
    for slot, pairs in by_slot.items():
        trajectories = [t for t, _ in pairs]
        samples, batch = build_samples(trajectories, [torch.full((len(t.transitions),), a) for t, a in pairs],
                                       trainer.config.max_seq_len, trainer.config.merge_steps)
        samples = [s for s in samples if any(s.advantages)]
        if samples:
            with trainer.learner.training(slot):
                stats.update({f"offline_{k}": v for k, v in trainer.update(samples).items()})
            stats["offline_reinforced_steps"] += batch.samples
    return stats


def finish(trainer: "Trainer", metrics: dict, publish: bool = True) -> dict:
    """Publish the next version (or only save it: `adapter_path`), log the iteration, checkpoint it."""
    n = trainer.iteration + 1
    path = trainer.publisher.path(n)
    if publish:
        trainer.publish(n)
    else:
        save_adapter(trainer.model, path)
    metrics = {"iteration": n, "version": trainer.version_name(n), "adapter_path": str(path), "offline": 1, **metrics}
    trainer.end_iteration(metrics)
    return metrics


__all__ = ["batch_advantages", "reinforce", "rewards_of", "train_offline"]
