"""Supervised warm start: fit the LoRA to recorded demonstrations.

A 135M model does not emit tool calls out of the box, so RL has no signal to start from.
Demonstrations recorded through the same front end (the agent run on a scripted expert) are
turned into the very samples RL uses (same token ids, same masks) and trained with the
negative log-likelihood of their completions.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Trajectory
from forge_bridge.policies.base import DEFAULT_SLOT
from forge_bridge.trainer.batch import build_samples
from forge_bridge.trainer.config import SFTConfig
from forge_bridge.trainer.learner import Stepping, plan
from forge_bridge.trainer.lora import adapter_parameters
from forge_bridge.trainer.losses import aggregate
from forge_bridge.trainer.probe import ProbeReport
from forge_bridge.trainer.run import WARM_START
from forge_bridge.trainer.rollouts import Rollout

if TYPE_CHECKING:
    from forge_bridge.trainer.loop import Trainer


def sft_loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the trained tokens.  [B, T] -> scalar."""
    return -aggregate(logp, mask, "token")


def sft(trainer: "Trainer", demonstrations: Sequence[Trajectory], config: SFTConfig = SFTConfig(), *,
        rollout: Rollout | None = None, held_out: Sequence[Any] | None = None, kind_key: str = "kind",
        on_epoch: Callable[[int], None] | None = None) -> dict:
    """The warm start: fit `trainer`'s LoRA to the demonstrations (trajectories recorded through
    the agent, e.g. on a `ScriptedPolicy`, or read from the store) and publish it as version
    '<run>-sft' (not an RL iteration: GRPO's versions still count from v1), with a checkpoint a
    resumed run starts from. With `rollout` and `held_out` tasks, each is run greedily before and
    after the fit, and the result says whether the warm start learned anything
    (`held_out_base`, `held_out_sft`: success per kind). With per-role LoRAs (`role_slots`),
    each role's demonstrations train its own LoRA (`sft_loss_first/<slot>`, ...). `on_epoch(k)`
    is called after each epoch k (from 1), the model in eval mode (per slot, with role slots)."""
    trainer.ranks.check_local("SFT")
    demonstrations = list(demonstrations)
    trajs = [t for t in demonstrations if t.transitions]
    if not trajs:
        raise InvalidArgument(f"sft: no demonstrations to learn from ({len(demonstrations)} given, none with a "
                              "recorded step); record some through your agent (fb.record_demonstrations, or "
                              "fb.ScriptedPolicy in an episode) or import them: see docs/own-agent.md")
    if (rollout is None) != (held_out is None):
        raise InvalidArgument("sft: the held-out check needs both rollout= and held_out= (or neither)")
    before = (trainer.probe(rollout, held_out, name="check-base", greedy=True, kind_key=kind_key)
              if held_out and rollout is not None else None)  # the one is given with the other: checked above
    by_slot: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_slot.setdefault(trainer.slot_of_steps(t.role, [t]), []).append(t)
    result: dict = {"sft_samples": 0, "sft_tokens": 0}
    losses: list[float] = []
    for slot in sorted(by_slot, key=lambda s: (s != DEFAULT_SLOT, s)):
        ones = [torch.ones(len(t.transitions)) for t in by_slot[slot]]
        samples, stats = build_samples(by_slot[slot], ones, trainer.config.max_seq_len, trainer.config.merge_steps)
        if not samples:
            continue
        with trainer.learner.training(slot):
            mine = _fit(trainer, samples, config, slot, desc="sft" if len(by_slot) == 1 else f"sft {slot}",
                        on_epoch=on_epoch)
        result["sft_samples"] += stats.samples
        result["sft_tokens"] += stats.trained_tokens
        if len(by_slot) > 1:
            result[f"sft_loss_first/{slot}"], result[f"sft_loss_last/{slot}"] = mine[0], mine[-1]
        losses += mine
    if not losses:
        raise InvalidArgument("sft: the demonstrations hold no trainable steps (were they recorded with token "
                              "ids, by a policy the trainer's tokenizer matches?)")
    result.update(sft_loss_first=losses[0], sft_loss_last=losses[-1], sft_demonstrations=len(trajs))
    if config.publish:
        result["version"] = trainer.publish(WARM_START)
        trainer.save_checkpoint()  # iteration 0, the warm start's weights: a resumed run starts here
    if before is not None:
        assert rollout is not None and held_out is not None  # before was probed with both
        after = trainer.probe(rollout, held_out, name="check-sft", greedy=True, kind_key=kind_key)
        result["held_out_base"] = {k: v.success_rate for k, v in before.kinds.items()}
        result["held_out_sft"] = {k: v.success_rate for k, v in after.kinds.items()}
        result["held_out_verdict"] = verdict(before, after)
        if trainer.config.run.progress:
            print(result["held_out_verdict"])
    trainer.run.log.log_event("sft", {k: v for k, v in result.items() if isinstance(v, (int, float))}
                             | {f"{key}/{kind}": v for key in ("held_out_base", "held_out_sft")
                                for kind, v in result.get(key, {}).items()})
    return result


def verdict(before: ProbeReport, after: ProbeReport) -> str:
    """Whether the warm start learned anything on the held-out tasks, kind by kind."""
    lines = [f"held-out check of the warm start, greedy ({before.rollouts} tasks): "
             f"{before.success_rate:.0%} before, {after.success_rate:.0%} after"]
    for kind, k in after.kinds.items():
        base = before.kinds[kind]
        note = ("learned nothing: more demonstrations of it, more epochs or a higher lr (docs/own-agent.md)"
                if k.successes <= base.successes else "learned")
        lines.append(f"  {kind}: {base.successes} -> {k.successes} of {k.rollouts} ({note})")
    return "\n".join(lines)


def _fit(trainer: "Trainer", samples: list, config: SFTConfig, slot: str, desc: str,
         on_epoch: Callable[[int], None] | None = None) -> list[float]:
    """`config.epochs` passes of NLL steps on the LoRA of `slot` (active: `learner.training`), each
    the optimizer step RL takes (microbatches within `max_memory_gb`, the LoRA's gradient clipped),
    with a fresh optimizer of its own; the loss of every step."""
    from tqdm.auto import tqdm

    learner, c = trainer.learner, trainer.config.optimizer
    samples = [dataclasses.replace(s, temperature=1.0) for s in samples]  # imitated as the model's own distribution
    stepping = Stepping(torch.optim.AdamW(adapter_parameters(learner.model, slot), lr=config.lr), ("0",),
                        (config.lr,), c.grad_clip, 0, c.microbatch_size, "token")
    size = config.batch_size or c.minibatch_size
    learner.model.train()
    losses: list[float] = []
    calls = [s.calls for s in samples]
    with tqdm(desc=desc, disable=not trainer.config.run.progress) as bar:
        for epoch in range(1, config.epochs + 1):
            steps = plan(trainer.run.rng, calls, 1, size)[0]
            if epoch == 1:
                bar.reset(total=config.epochs * len(steps))  # an estimate: packing merged samples varies a little
            for minibatch in steps:
                stats = learner.step([samples[i] for i in minibatch], _objective, stepping)
                losses.append(stats["loss"])
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if on_epoch is not None:
                learner.model.eval()
                on_epoch(epoch)
                learner.model.train()
    learner.model.eval()
    return losses


def _objective(logp: torch.Tensor, hidden: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
    return sft_loss(logp, batch["loss_mask"]), {}


__all__ = ["SFTConfig", "sft", "sft_loss", "verdict"]
