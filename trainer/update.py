"""The update: `epochs` passes of optimizer steps over one iteration's samples.

Each step is one minibatch, its gradient accumulated over microbatches (each weighted by its share
of what the loss averages over, so the step equals one pass over the whole minibatch), its
parameter groups clipped each on its own, and its learning rate warmed up over the optimizer's
first steps. The loss is the algorithm's (a `Loss`: GRPO's, PPO's or the warm start's objective);
this module only runs it, the same for all three, alone or on a process group (`ranks`:
`distributed.Alone` or `distributed.Ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from forge_bridge.trainer.batch import Sample

if TYPE_CHECKING:
    from forge_bridge.trainer.distributed import Alone
    from forge_bridge.trainer.learner import Learner

Loss = Callable[[torch.Tensor, torch.Tensor, dict], tuple[torch.Tensor, dict]]
"""(logp [B, T], hidden [B, T, H], collated batch) -> (the loss, its statistics): the algorithm's objective."""


@dataclass(frozen=True)
class Stepping:
    """How each optimizer step of an update is taken."""

    optimizer: torch.optim.Optimizer
    """The optimizer of the LoRA (and heads) being trained."""
    names: tuple[str, ...]
    """Its parameter groups' names ('0': the LoRA), for the gradient norms' metric names."""
    base_lrs: tuple[float, ...]
    """Each parameter group's learning rate after the warm-up."""
    grad_clip: float
    """Largest gradient norm of each parameter group."""
    warmup_steps: int
    """Optimizer steps over which the rates rise to `base_lrs` (0: none)."""
    microbatch_size: int | None
    """Largest microbatch (None: the whole minibatch, within the memory budget)."""
    aggregation: str
    """'token' or 'sequence': what the loss averages over, and so how microbatches are weighted."""


def plan(rng: Random, count: int, epochs: int, minibatch_size: int) -> list[list[list[int]]]:
    """Which samples each optimizer step takes: epochs x minibatches x sample indices, each
    epoch's order shuffled by `rng`."""
    out = []
    for _ in range(epochs):
        order = list(range(count))
        rng.shuffle(order)
        out.append([order[start:start + minibatch_size] for start in range(0, count, minibatch_size)])
    return out


def update(learner: "Learner", ranks: "Alone", samples: list[Sample], steps: list[list[list[int]]], loss: Loss,
           stepping: Stepping) -> dict:
    """The optimizer steps of `steps` (`plan`) on the active LoRA; returns the statistics averaged
    over the steps, and how many were taken. In a process group every rank runs this at once on
    the same samples and takes its share of each step (`trainer/distributed.py`)."""
    if len(steps) > 1 or len(steps[0]) > 1:  # later steps would otherwise see an already-moved policy
        score_old(learner, ranks, samples, stepping.microbatch_size or max(len(m) for e in steps for m in e))
    learner.model.train()
    totals: dict[str, float] = {}
    for epoch in steps:
        for indices in epoch:
            stats = optimizer_step(learner, ranks, [samples[i] for i in indices], loss, stepping)
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v
    learner.model.eval()
    taken = sum(map(len, steps))
    return {k: v / max(taken, 1) for k, v in totals.items()} | {"optimizer_steps": taken}


def score_old(learner: "Learner", ranks: "Alone", samples: list[Sample], size: int) -> None:
    """pi_old: the log-probabilities of every sample under the weights before this update (in a
    process group, each rank scores its share and they exchange the results)."""
    chunks = [chunk for chunk, _ in microbatches(samples, size, "token", learner.chunker)]
    scored = {}
    with torch.no_grad():
        for k, chunk in ranks.share([(c, 1.0) for c in chunks])[0]:
            logp = learner.score(learner.collate(chunk))[0]
            if k is not None:
                scored[k] = [logp[b, :len(s.input_ids)].tolist() for b, s in enumerate(chunk)]
    scored = {k: v for part in ranks.gather(scored) for k, v in part.items()}
    for k, chunk in enumerate(chunks):
        for sample, logp in zip(chunk, scored[k]):
            sample.trainer_logprobs = logp


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


def optimizer_step(learner: "Learner", ranks: "Alone", minibatch: list[Sample], loss: Loss,
                   stepping: Stepping) -> dict[str, float]:
    """One optimizer step on the minibatch: forward, objective and backward per microbatch (each
    weighted by its share of the minibatch; PPO's value loss, averaged over steps rather than
    tokens, only approximately), then each parameter group clipped on its own, the warmed-up
    rate, and the step. In a process group each rank runs its share of the microbatches, weighted
    by the world size too (torch averages the ranks' gradients), reduced on the last backward."""
    optimizer = stepping.optimizer
    optimizer.zero_grad(set_to_none=True)
    size = stepping.microbatch_size or ranks.microbatch_size(len(minibatch))
    chunks = microbatches(minibatch, size, stepping.aggregation, learner.chunker)
    runs, loads = ranks.share(chunks)
    stats: dict[str, float] = {}
    for n, (k, chunk) in enumerate(runs):
        weight = 0.0 if k is None else chunks[k][1] * ranks.size  # k None: a filler chunk, run for nothing
        batch = learner.collate(chunk)
        with ranks.reducing(learner, n == len(runs) - 1):
            logp, hidden, entropy = learner.score(batch, with_entropy=True)
            with learner.autocast():
                value, chunk_stats = loss(logp, hidden, batch)
            (value * weight).backward()
        chunk_stats.update(loss=float(value.detach()),
                           entropy=float(entropy.mean()) if entropy is not None and entropy.numel() else 0.0)
        for key, v in chunk_stats.items():
            stats[key] = stats.get(key, 0.0) + (0.0 if k is None else chunks[k][1] * v)
    stats = ranks.reduce(stats, loads)
    # each parameter group clipped on its own: a young value head's large gradient must not
    # shrink the LoRA's step (the first group is the LoRA; its norm is `grad_norm`)
    for n, (group, name) in enumerate(zip(optimizer.param_groups, stepping.names)):
        norm = ranks.norm(torch.nn.utils.clip_grad_norm_(group["params"], stepping.grad_clip))
        stats["grad_norm" if n == 0 else f"grad_norm_{name}"] = norm
    stats["lr"] = warm_up(optimizer, stepping.base_lrs, stepping.warmup_steps)
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


__all__ = ["Loss", "Stepping", "microbatches", "optimizer_step", "plan", "score_old", "update", "warm_up"]
