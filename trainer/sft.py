"""Supervised warm start: fit the LoRA to recorded demonstrations.

A 135M model does not emit tool calls out of the box, so RL has no signal to start from.
Demonstrations recorded through the same front end (the agent run on a scripted expert) are
turned into the very samples RL uses (same token ids, same masks) and trained with the
negative log-likelihood of their completions.
"""

from __future__ import annotations

from typing import Sequence

import torch

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.core.types import Trajectory
from forge_bridge.policies.base import DEFAULT_SLOT
from forge_bridge.trainer.batch import build_samples
from forge_bridge.trainer.config import SFTConfig
from forge_bridge.trainer.logprobs import token_logprobs
from forge_bridge.trainer.loop import Trainer
from forge_bridge.trainer.lora import adapter_parameters
from forge_bridge.trainer.losses import aggregate


def sft_loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the trained tokens.  [B, T] -> scalar."""
    return -aggregate(logp, mask, "token")


def supervised_finetune(trainer: Trainer, demonstrations: Sequence[Trajectory],
                        config: SFTConfig = SFTConfig()) -> dict:
    """Train `trainer`'s LoRA on the demonstrations (and, by default, publish the result as its
    next adapter version); returns the loss before and after. With per-role LoRAs
    (`role_slots`), each role's demonstrations train its own LoRA, and the losses are given per
    slot too (`sft_loss_first/<slot>`)."""
    trajs = [t for t in demonstrations if t.transitions]
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
        with trainer.training(slot):
            mine = _fit(trainer, samples, config, slot, desc="sft" if len(by_slot) == 1 else f"sft {slot}")
        result["sft_samples"] += stats.samples
        result["sft_tokens"] += stats.trained_tokens
        if len(by_slot) > 1:
            result[f"sft_loss_first/{slot}"], result[f"sft_loss_last/{slot}"] = mine[0], mine[-1]
        losses += mine
    if not losses:
        raise InvalidArgument("supervised_finetune: the demonstrations hold no trainable steps "
                              "(were they recorded with token ids?)")
    result.update(sft_loss_first=losses[0], sft_loss_last=losses[-1])
    if config.publish:
        result["adapter"] = trainer.publish_next()
    return result


def _fit(trainer: Trainer, samples: list, config: SFTConfig, slot: str, desc: str) -> list[float]:
    """`config.epochs` passes of NLL steps on the LoRA of `slot` (active: `trainer.training`);
    the loss of every step."""
    from tqdm.auto import tqdm

    params = adapter_parameters(trainer.model, slot)
    optimizer = torch.optim.AdamW(params, lr=config.lr or trainer.config.lr)
    trainer.model.train()
    losses = []
    size = config.batch_size or trainer.config.minibatch_size
    steps = config.epochs * -(-len(samples) // size)
    with tqdm(total=steps, desc=desc, disable=not trainer.config.progress) as bar:
        for _ in range(config.epochs):
            order = list(range(len(samples)))
            trainer.rng.shuffle(order)
            for start in range(0, len(order), size):
                batch = trainer.collate([samples[i] for i in order[start:start + size]])
                with trainer.autocast():
                    logp, _, _ = token_logprobs(trainer.model, batch["input_ids"], batch["attention_mask"],
                                                batch["loss_mask"], share_prefix=trainer.share_prefix)
                    loss = sft_loss(logp, batch["loss_mask"])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, trainer.config.grad_clip)
                optimizer.step()
                losses.append(float(loss.detach()))
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
    trainer.model.eval()
    return losses


__all__ = ["SFTConfig", "sft_loss", "supervised_finetune"]
