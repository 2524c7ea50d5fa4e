"""The update: `epochs` passes of optimizer steps over one iteration's samples.

Each step is one minibatch, its gradient accumulated over microbatches (each weighted by its share
of what the loss averages over, so the step equals one pass over the whole minibatch), its
parameter groups clipped each on its own, and its learning rate warmed up over the optimizer's
first steps. The loss is the algorithm's (`Trainer.loss`); this module only runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch

from forge_bridge.trainer.batch import Sample

if TYPE_CHECKING:
    from forge_bridge.trainer.loop import Trainer


def update(trainer: "Trainer", samples: list[Sample]) -> dict:
    """`epochs` passes of minibatch steps over the samples on the active LoRA; returns the
    statistics averaged over the steps, and how many were taken."""
    config = trainer.config
    if config.epochs > 1 or len(samples) > config.minibatch_size:
        score_old(trainer, samples)  # later steps would otherwise see an already-moved policy
    trainer.model.train()
    totals: dict[str, float] = {}
    steps = 0
    for _ in range(config.epochs):
        order = list(range(len(samples)))
        trainer.rng.shuffle(order)
        for start in range(0, len(order), config.minibatch_size):
            stats = optimizer_step(trainer, [samples[i] for i in order[start:start + config.minibatch_size]])
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v
            steps += 1
    trainer.model.eval()
    return {k: v / max(steps, 1) for k, v in totals.items()} | {"optimizer_steps": steps}


def score_old(trainer: "Trainer", samples: list[Sample]) -> None:
    """pi_old: the log-probabilities of every sample under the weights before this update."""
    size = trainer.config.microbatch_size or trainer.config.minibatch_size
    with torch.no_grad():
        for chunk, _ in microbatches(samples, size, "token", trainer.chunker):
            logp = trainer.score(trainer.collate(chunk))[0]
            for b, sample in enumerate(chunk):
                sample.trainer_logprobs = logp[b, :len(sample.input_ids)].tolist()


def microbatches(minibatch: Sequence[Sample], size: int | None, aggregation: str,
                 chunker: Callable[[list[int]], list[list[int]]] | None = None) -> list[tuple[list[Sample], float]]:
    """The minibatch in chunks of `size` sequences (sorted by length: less padding, the same
    step), each with its weight: its share of the trained tokens ('token' aggregation) or of the
    sequences with any ('sequence'). `chunker` (a memory budget: `memory.chunk_by_budget`) cuts
    the sorted lengths into chunks first; `size` still caps each."""
    size = size or len(minibatch)
    by_length = sorted(minibatch, key=lambda s: len(s.input_ids))
    groups = chunker([len(s.input_ids) for s in by_length]) if chunker else [list(range(len(by_length)))]
    chunks = [[by_length[i] for i in group[k:k + size]] for group in groups for k in range(0, len(group), size)]
    if aggregation == "token":
        shares = [sum(sum(s.loss_mask) for s in c) for c in chunks]
    else:
        shares = [sum(1 for s in c if any(s.loss_mask)) for c in chunks]
    total = max(sum(shares), 1)
    return [(chunk, share / total) for chunk, share in zip(chunks, shares)]


def optimizer_step(trainer: "Trainer", minibatch: list[Sample]) -> dict[str, float]:
    """One optimizer step on the minibatch (PPO's value loss, averaged over steps rather than
    tokens, is accumulated only approximately)."""
    optimizer = trainer.optimizer
    optimizer.zero_grad(set_to_none=True)
    stats: dict[str, float] = {}
    for chunk, weight in microbatches(minibatch, trainer.config.microbatch_size, trainer.config.loss_aggregation,
                                      trainer.chunker):
        batch = trainer.collate(chunk)
        logp, hidden, entropy = trainer.score(batch, with_entropy=True)
        with trainer.autocast():
            loss, chunk_stats = trainer.loss(logp, hidden, batch)
        (loss * weight).backward()
        chunk_stats.update(loss=float(loss.detach()),
                           entropy=float(entropy.mean()) if entropy is not None and entropy.numel() else 0.0)
        for k, v in chunk_stats.items():
            stats[k] = stats.get(k, 0.0) + weight * v
    # each parameter group clipped on its own: a young value head's large gradient must not
    # shrink the LoRA's step (the first group is the LoRA; its norm is `grad_norm`)
    for n, (group, name) in enumerate(zip(optimizer.param_groups, trainer.group_names[trainer.active_slot])):
        norm = float(torch.nn.utils.clip_grad_norm_(group["params"], trainer.config.grad_clip))
        stats["grad_norm" if n == 0 else f"grad_norm_{name}"] = norm
    stats["lr"] = warm_up(optimizer, trainer.base_lrs[trainer.active_slot], trainer.config.warmup_steps)
    optimizer.step()
    return stats


def warm_up(optimizer: torch.optim.Optimizer, base_lrs: Sequence[float], warmup_steps: int) -> float:
    """Scale the learning rates for the coming step; returns the first group's. Adam's first
    steps move every weight by the full rate whatever its gradient's size (m/sqrt(v) is a sign at
    step 1), so on a noisy first batch a fresh optimizer takes its largest steps."""
    first = optimizer.param_groups[0]["params"][0]
    done = int(optimizer.state.get(first, {}).get("step", 0))
    scale = min(1.0, (done + 1) / warmup_steps) if warmup_steps else 1.0
    for group, base in zip(optimizer.param_groups, base_lrs):
        group["lr"] = base * scale
    return optimizer.param_groups[0]["lr"]


__all__ = ["microbatches", "optimizer_step", "score_old", "update", "warm_up"]
