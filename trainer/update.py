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
from forge_bridge.trainer.distributed import assign, full_norm, reducing

if TYPE_CHECKING:
    from forge_bridge.trainer.loop import Trainer


def plan(trainer: "Trainer", count: int) -> list[list[list[int]]]:
    """Which samples each optimizer step takes: epochs x minibatches x sample indices, each
    epoch's order shuffled by the trainer's random generator."""
    config, out = trainer.config, []
    for _ in range(config.epochs):
        order = list(range(count))
        trainer.rng.shuffle(order)
        out.append([order[start:start + config.minibatch_size] for start in range(0, count, config.minibatch_size)])
    return out


def update(trainer: "Trainer", samples: list[Sample], steps: list[list[list[int]]] | None = None) -> dict:
    """The optimizer steps of `steps` (`plan`; None: a new plan) on the active LoRA; returns the
    statistics averaged over the steps, and how many were taken. In a process group, every rank runs this
    at once on the same samples and takes its share of each step (`trainer/distributed.py`)."""
    steps = plan(trainer, len(samples)) if steps is None else steps
    if len(steps) > 1 or len(steps[0]) > 1:
        score_old(trainer, samples)  # later steps would otherwise see an already-moved policy
    trainer.model.train()
    totals: dict[str, float] = {}
    for epoch in steps:
        for indices in epoch:
            stats = optimizer_step(trainer, [samples[i] for i in indices])
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v
    trainer.model.eval()
    taken = sum(map(len, steps))
    return {k: v / max(taken, 1) for k, v in totals.items()} | {"optimizer_steps": taken}


def score_old(trainer: "Trainer", samples: list[Sample]) -> None:
    """pi_old: the log-probabilities of every sample under the weights before this update (in a
    process group, each rank scores its share and they exchange the results)."""
    size = trainer.config.microbatch_size or trainer.config.minibatch_size
    chunks = [chunk for chunk, _ in microbatches(samples, size, "token", trainer.chunker)]
    scored = {}
    with torch.no_grad():
        for k, chunk in my_share(trainer, [(c, 1.0) for c in chunks])[0]:
            logp = trainer.score(trainer.collate(chunk))[0]
            if k is not None:
                scored[k] = [logp[b, :len(s.input_ids)].tolist() for b, s in enumerate(chunk)]
    if trainer.group is not None:
        scored = {k: v for part in trainer.group.gather(scored) for k, v in part.items()}
    for k, chunk in enumerate(chunks):
        for sample, logp in zip(chunk, scored[k]):
            sample.trainer_logprobs = logp


def my_share(trainer: "Trainer", chunks: list[tuple[list[Sample], float]]
             ) -> tuple[list[tuple[int | None, list[Sample]]], list[int]]:
    """The (index, chunk) pairs this process runs -- all of them alone; in a process group, its
    share by tokens (`distributed.assign`), padded with index None (a chunk run for nothing) to
    as many as any rank runs, since every rank must make the same collective calls -- and the
    tokens each rank runs."""
    group = trainer.group
    sizes = [sum(len(s.input_ids) for s in c) for c, _ in chunks]
    if group is None:
        return list(enumerate(c for c, _ in chunks)), [sum(sizes)]
    shares = assign(sizes, group.size)
    mine, filler = shares[group.rank], min(range(len(chunks)), key=lambda i: sizes[i])
    runs = [(i, chunks[i][0]) for i in mine] + [(None, chunks[filler][0])] * (max(map(len, shares)) - len(mine))
    return runs, [sum(sizes[i] for i in share) for share in shares]


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
    tokens, is accumulated only approximately). In a process group each rank runs its share of
    the microbatches, each weighted by its share of the whole minibatch times the world size
    (torch averages the ranks' gradients), and the gradients are reduced on the last backward."""
    optimizer, group = trainer.optimizer, trainer.group
    optimizer.zero_grad(set_to_none=True)
    size = trainer.config.microbatch_size or (-(-len(minibatch) // group.size) if group else None)
    chunks = microbatches(minibatch, size, trainer.config.loss_aggregation, trainer.chunker)
    weights = dict(enumerate(w * (group.size if group else 1) for _, w in chunks))
    runs, loads = my_share(trainer, chunks)
    stats: dict[str, float] = {}
    for n, (k, chunk) in enumerate(runs):
        weight = 0.0 if k is None else weights[k]
        batch = trainer.collate(chunk)
        with reducing(trainer, n == len(runs) - 1):
            logp, hidden, entropy = trainer.score(batch, with_entropy=True)
            with trainer.autocast():
                loss, chunk_stats = trainer.loss(logp, hidden, batch)
            (loss * weight).backward()
        chunk_stats.update(loss=float(loss.detach()),
                           entropy=float(entropy.mean()) if entropy is not None and entropy.numel() else 0.0)
        for key, v in chunk_stats.items():
            stats[key] = stats.get(key, 0.0) + (0.0 if k is None else chunks[k][1] * v)
    if group is not None:
        stats = {key: sum(part.get(key, 0.0) for part in group.gather(stats)) for key in sorted(stats)}
        stats.update(world_size=group.size, rank_tokens_max=max(loads), rank_tokens_min=min(loads))
    # each parameter group clipped on its own: a young value head's large gradient must not
    # shrink the LoRA's step (the first group is the LoRA; its norm is `grad_norm`)
    for n, (group_params, name) in enumerate(zip(optimizer.param_groups, trainer.group_names[trainer.active_slot])):
        norm = full_norm(torch.nn.utils.clip_grad_norm_(group_params["params"], trainer.config.grad_clip))
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


__all__ = ["microbatches", "my_share", "optimizer_step", "plan", "score_old", "update", "warm_up"]
