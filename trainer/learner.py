"""The model being trained: the base with a LoRA per policy slot, their optimizers, any heads
trained beside them (PPO's value head), scoring (log-probabilities of a batch's tokens), and the
update.

The update is `epochs` passes of optimizer steps over an iteration's samples (`plan`). Each step
is one minibatch, its gradient accumulated over microbatches (each weighted by its share of what
the loss averages over, so the step equals one pass over the whole minibatch; a memory budget
cuts them, `chunker`), its parameter sets (torch's param_groups) clipped each on its own, and its learning rate warmed
up over the optimizer's first steps. The loss is the algorithm's (a `Loss`: GRPO's, PPO's or the
warm start's objective): one step serves all three, alone or on a job of several processes
(`ranks`). The learner holds no run state (the run folder and the publisher are parts of their
own). The `Reference` is the model the KL term holds it near: the base (the adapter disabled), or
weights frozen once, such as the SFT warm start's.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from forge_bridge.policies.base import DEFAULT_SLOT
from forge_bridge.policies.device import autocast, bf16_supported, resolve_device
from forge_bridge.trainer import memory
from forge_bridge.trainer.batch import Sample, collate
from forge_bridge.trainer.config import TrainerConfig
from forge_bridge.trainer.logprobs import EAGER_MAX_LEN, choose_attention, token_logprobs
from forge_bridge.trainer.lora import adapter_parameters, attach_lora, is_lora, save_adapter

if TYPE_CHECKING:
    from forge_bridge.trainer.distributed import Alone, Ranks

Loss = Callable[[torch.Tensor, torch.Tensor, dict], tuple[torch.Tensor, dict]]
"""(logp [B, T], hidden [B, T, H], collated batch) -> (the loss, its statistics): the algorithm's objective."""


Heads = Callable[[int], dict[str, tuple[torch.nn.Module, float]]]
"""hidden size -> {name: (a module trained beside the LoRA, its learning rate)}."""


@dataclass(frozen=True)
class Stepping:
    """How each optimizer step of an update is taken."""

    optimizer: torch.optim.Optimizer
    """The optimizer of the LoRA (and heads) being trained."""
    names: tuple[str, ...]
    """Its parameter sets' names ('0': the LoRA), for the gradient norms' metric names."""
    base_lrs: tuple[float, ...]
    """Each parameter set's learning rate after the warm-up."""
    grad_clip: float
    """Largest gradient norm of each parameter set."""
    warmup_steps: int
    """Optimizer steps over which the rates rise to `base_lrs` (0: none)."""
    microbatch_size: int | None
    """Largest microbatch (None: the whole minibatch, within the memory budget)."""
    aggregation: str
    """'token' or 'sequence': what the loss averages over, and so how microbatches are weighted."""


class Learner:
    """The base model with a LoRA per slot (`slots[0]` the shared one), an optimizer per LoRA,
    the heads, and how a batch is scored."""

    def __init__(self, source: str, config: TrainerConfig, slots: Sequence[str], ranks: "Alone | Ranks",
                 heads: Heads | None = None) -> None:
        from forge_bridge.policies import models

        self.config, self.ranks = config, ranks
        """Alone, or this process's place in a job: each step's share, reductions and norms."""
        base, self.tokenizer = models.load(source)
        self.pad_id: int = self.tokenizer.pad_token_id or 0
        """What collated batches are padded with (masked out wherever it lands)."""
        self.device = device = ranks.device(resolve_device(config.optimizer.device))
        """Where the model, the batches and the optimizer state live."""
        base.to(device)
        self.eager_up_to = EAGER_MAX_LEN if str(device) == "cpu" and hasattr(base, "set_attn_implementation") else 0
        """Batches up to this many tokens run eager attention (see `attention`); 0: the model's own."""
        if self.eager_up_to:
            base.set_attn_implementation("eager")
        if config.optimizer.gradient_checkpointing:
            base.activation_checkpointing_enable({"use_reentrant": False})
        self.share_prefix = not config.optimizer.gradient_checkpointing
        """Whether a microbatch's shared token prefix runs once (not under activation checkpointing,
        nor once FSDP2 shards the model: ranks would make different numbers of collective calls)."""
        self.slots = list(slots)
        """The LoRAs trained, by policy slot: the shared one first, then one per role slot."""
        self.model = attach_lora(base, config.lora.rank, config.lora.alpha, config.lora.targets,
                                 extra_adapters=self.slots[1:], seed=config.run.seed)
        self.bf16 = bf16_supported(device) if config.optimizer.bf16 is None else config.optimizer.bf16
        made = heads(base.config.hidden_size) if heads else {}
        self.heads: dict[str, torch.nn.Module] = {name: module.to(device) for name, (module, _) in made.items()}
        """Modules trained beside the LoRA (PPO's value head), by name; shared by every slot."""
        self.head_lrs = {name: lr for name, (_, lr) in made.items()}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.param_names: dict[str, list[str]] = {}
        """Slot -> the names of its optimizer's parameter sets ('0': the LoRA, then the heads)."""
        self.base_lrs: dict[str, list[float]] = {}
        for slot in self.slots:
            self.remake_optimizer(slot)
        self.active_slot = DEFAULT_SLOT
        """The slot whose LoRA forward passes, updates and `optimizer` use now (`training`)."""
        self.bodies: dict[str, torch.nn.Module] = {}
        """Slot -> the decoder body wrapped for a process group's update (DDP), once spread."""
        self.chunker = memory.budget_chunker(self.model, base.config, config, device, self.eager_up_to)
        """Cuts a minibatch's sorted lengths into microbatches within `max_memory_gb` (None: no budget)."""

    # ------------------------------------------------------------------ optimizers
    def remake_optimizer(self, slot: str) -> None:
        """A fresh optimizer for a slot's LoRA (one per LoRA: a role's updates never move another
        role's adapter or state), with its parameter sets' names and rates."""
        sets: list[dict[str, Any]] = [{"params": adapter_parameters(self.model, slot), "lr": self.config.optimizer.lr,
                                       "name": "0"}]
        sets += [{"params": list(module.parameters()), "lr": self.head_lrs[name], "name": name}
                   for name, module in self.heads.items()]
        self.param_names[slot] = [g.pop("name") for g in sets]
        self.optimizers[slot] = torch.optim.AdamW(sets)
        self.base_lrs[slot] = [g["lr"] for g in self.optimizers[slot].param_groups]

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer of the LoRA being trained now (the shared one outside an update)."""
        return self.optimizers[self.active_slot]

    def stepping(self) -> Stepping:
        """How the active slot's optimizer steps (`step`), from the config."""
        c = self.config.optimizer
        return Stepping(self.optimizer, tuple(self.param_names[self.active_slot]),
                        tuple(self.base_lrs[self.active_slot]), c.grad_clip, c.warmup_steps,
                        c.microbatch_size, self.config.loss.aggregation)

    @contextmanager
    def training(self, slot: str):
        """Forward passes, updates and `optimizer` use the LoRA of `slot` inside this block."""
        self.model.set_adapter(slot)
        self.active_slot = slot
        try:
            yield
        finally:
            self.model.set_adapter(DEFAULT_SLOT)
            self.active_slot = DEFAULT_SLOT

    def wrap(self, slot: str, body: torch.nn.Module) -> None:
        """Run the slot's forward passes through this wrapped decoder body (DDP's)."""
        self.bodies[slot] = body

    def sharded(self) -> None:
        """FSDP2 sharded the body: fresh optimizers on the sharded parameters, and no shared-prefix
        pass (ranks would make different numbers of collective calls)."""
        self.share_prefix = False
        for slot in self.slots:
            self.remake_optimizer(slot)

    # ------------------------------------------------------------------ scoring
    def autocast(self):
        """The precision context of forward passes (bf16 autocast where the device has it)."""
        return autocast(self.device, self.bf16)

    def collate(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
        """The samples as padded tensors on the learner's device."""
        return collate(samples, self.pad_id, self.device)

    def attention(self, length: int) -> None:
        """Choose the attention for a batch of `length` tokens (`logprobs.choose_attention`)."""
        if self.eager_up_to:
            choose_attention(self.model.get_base_model(), length, self.eager_up_to)

    def logprobs(self, batch: dict, with_entropy: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logp [B, T], hidden [B, T, H], entropy) of the batch under the model being trained, at
        each sample's sampling temperature."""
        self.attention(batch["input_ids"].shape[1])
        with self.autocast():
            return token_logprobs(self.model, batch["input_ids"], batch["attention_mask"],
                                  batch["loss_mask"], with_entropy, batch["temperature"],
                                  share_prefix=self.share_prefix, body=self.bodies.get(self.active_slot))

    # ------------------------------------------------------------------ the update
    def update(self, samples: list[Sample], steps: list[list[list[int]]], loss: Loss,
               stepping: Stepping) -> dict:
        """The optimizer steps of `steps` (`plan`) on the active LoRA; returns the statistics averaged
        over the steps, and how many were taken. In a process group every rank runs this at once on
        the same samples and takes its share of each step (`trainer/distributed.py`)."""
        if len(steps) > 1 or len(steps[0]) > 1:  # later steps would otherwise see an already-moved policy
            self.old_logprobs(samples, stepping.microbatch_size or max(len(m) for e in steps for m in e))
        self.model.train()
        totals: dict[str, float] = {}
        for epoch in steps:
            for indices in epoch:
                stats = self.step([samples[i] for i in indices], loss, stepping)
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
        self.model.eval()
        taken = sum(map(len, steps))
        return {k: v / max(taken, 1) for k, v in totals.items()} | {"optimizer_steps": taken}

    def old_logprobs(self, samples: list[Sample], size: int) -> None:
        """pi_old: the log-probabilities of every sample under the weights before this update (in a
        process group, each rank scores its share and they exchange the results)."""
        chunks = [chunk for chunk, _ in microbatches(samples, size, "token", self.chunker)]
        scored = {}
        with torch.no_grad():
            for k, chunk in self.ranks.share([(c, 1.0) for c in chunks])[0]:
                logp = self.logprobs(self.collate(chunk))[0]
                if k is not None:
                    scored[k] = [logp[b, :len(s.input_ids)].tolist() for b, s in enumerate(chunk)]
        scored = {k: v for part in self.ranks.gather(scored) for k, v in part.items()}
        for k, chunk in enumerate(chunks):
            for sample, row in zip(chunk, scored[k]):
                sample.trainer_logprobs = row

    def step(self, minibatch: list[Sample], loss: Loss, stepping: Stepping) -> dict[str, float]:
        """One optimizer step on the minibatch: forward, objective and backward per microbatch (each
        weighted by its share of the minibatch; PPO's value loss, averaged over steps rather than
        tokens, only approximately), then each parameter set clipped on its own, the warmed-up
        rate, and the step. In a process group each rank runs its share of the microbatches, weighted
        by the world size too (torch averages the ranks' gradients), reduced on the last backward."""
        optimizer = stepping.optimizer
        optimizer.zero_grad(set_to_none=True)
        size = self.ranks.microbatch_size(len(minibatch), stepping.microbatch_size)
        chunks = microbatches(minibatch, size, stepping.aggregation, self.chunker)
        runs, loads = self.ranks.share(chunks)
        stats: dict[str, float] = {}
        for n, (k, chunk) in enumerate(runs):
            weight = 0.0 if k is None else chunks[k][1] * self.ranks.size  # k None: a filler chunk, run for nothing
            batch = self.collate(chunk)
            with self.ranks.reducing(self, n == len(runs) - 1):
                logp, hidden, entropy = self.logprobs(batch, with_entropy=True)
                with self.autocast():
                    value, chunk_stats = loss(logp, hidden, batch)
                (value * weight).backward()
            chunk_stats.update(loss=float(value.detach()),
                               entropy=float(entropy.mean()) if entropy is not None and entropy.numel() else 0.0)
            for key, v in chunk_stats.items():
                stats[key] = stats.get(key, 0.0) + (0.0 if k is None else chunks[k][1] * v)
        stats = self.ranks.reduce(stats, loads)
        # each parameter set clipped on its own: a young value head's large gradient must not
        # shrink the LoRA's step (the first set is the LoRA; its norm is `grad_norm`)
        for n, (params, name) in enumerate(zip(optimizer.param_groups, stepping.names)):
            norm = self.ranks.norm(torch.nn.utils.clip_grad_norm_(params["params"], stepping.grad_clip))
            stats["grad_norm" if n == 0 else f"grad_norm_{name}"] = norm
        stats["lr"] = warm_up(optimizer, stepping.base_lrs, stepping.warmup_steps)
        optimizer.step()
        return stats

    # ------------------------------------------------------------------ state
    def lora_weights(self) -> dict[str, torch.Tensor]:
        """Every slot's LoRA weights by parameter name, on the CPU."""
        return {n: p.detach().cpu() for n, p in self.model.named_parameters() if is_lora(n)}

    def load_state(self, weights: dict[str, torch.Tensor], optimizers: dict[str, dict]) -> None:
        """Make these LoRA weights and optimizer states this learner's (`lora_weights`, each
        optimizer's `state_dict`)."""
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value.to(params[name].device))
        for slot, optimizer in self.optimizers.items():
            optimizer.load_state_dict(optimizers[slot])


class Reference:
    """The model the KL term compares with: the base (None frozen) or a frozen copy."""

    def __init__(self) -> None:
        self.model: Any = None
        """The frozen reference, merged into a plain model (None: the base, adapter disabled)."""
        self.lora: dict[str, torch.Tensor] | None = None
        """The LoRA weights `model` was merged from."""

    def freeze(self, model: Any, folder: Path) -> Path:
        """Make `model`'s current LoRA the reference; saved in `folder`, so a resumed run keeps it."""
        path = save_adapter(model, folder)
        self.load(model, path)
        return path

    def load(self, model: Any, path: Path) -> None:
        """The reference from a saved LoRA of `model`'s shape."""
        from safetensors.torch import load_file

        self.load_weights(model, load_file(str(Path(path) / "adapter_model.safetensors")))

    def weights(self) -> dict[str, torch.Tensor] | None:
        """The frozen reference's LoRA as saved (peft's names), to give another process (None: the base)."""
        return self.lora

    def load_weights(self, model: Any, lora: dict[str, torch.Tensor]) -> None:
        """The reference from LoRA weights of `model`'s shape (peft's saved names)."""
        from peft import set_peft_model_state_dict

        ref = copy.deepcopy(model)
        set_peft_model_state_dict(ref, lora)
        self.lora = lora
        ref = ref.merge_and_unload().eval()  # a plain model: no LoRA cost in its forward
        for p in ref.parameters():
            p.requires_grad_(False)
        self.model = ref

    def logprobs(self, model: Any, batch: dict, share_prefix: bool) -> torch.Tensor:
        """Log-probabilities [B, T] of the batch's tokens under the reference, without gradient."""
        args = (batch["input_ids"], batch["attention_mask"], batch["loss_mask"], False, batch.get("temperature"))
        with torch.no_grad():
            if self.model is not None:
                return token_logprobs(self.model, *args)[0]
            with model.disable_adapter():
                return token_logprobs(model, *args, share_prefix=share_prefix)[0]


def plan(rng: Random, calls: Sequence[int], epochs: int, minibatch_size: int) -> list[list[list[int]]]:
    """Which samples each optimizer step takes: epochs x minibatches x sample indices, each
    epoch's order shuffled by `rng`. `calls[i]` is the model calls sample i trains (more than one
    where an episode's calls were merged): a minibatch takes samples until it holds
    `minibatch_size` calls, so merging changes what a sequence holds, not how many optimizer steps
    an iteration takes (one call per sample: minibatches of `minibatch_size` samples)."""
    out = []
    for _ in range(epochs):
        order = list(range(len(calls)))
        rng.shuffle(order)
        steps: list[list[int]] = [[]]
        held = 0
        for i in order:
            if held >= minibatch_size:
                steps.append([])
                held = 0
            steps[-1].append(i)
            held += calls[i]
        out.append([step for step in steps if step])
    return out


def microbatches(minibatch: Sequence[Sample], size: int | None, aggregation: str,
                 chunker: Callable[[list[int]], list[list[int]]] | None = None) -> list[tuple[list[Sample], float]]:
    """The minibatch in chunks of `size` sequences (sorted by length: less padding, the same
    step), each with its weight: its share of the trained tokens ('token' aggregation) or of the
    sequences with any ('sequence'). `chunker` (a memory budget: `memory.chunk_by_budget`) cuts
    the sorted lengths into chunks first; `size` still caps each."""
    size = size or len(minibatch)
    by_length = sorted(minibatch, key=lambda s: len(s.input_ids))
    fits = chunker([len(s.input_ids) for s in by_length]) if chunker else [list(range(len(by_length)))]
    chunks = [[by_length[i] for i in fit[k:k + size]] for fit in fits for k in range(0, len(fit), size)]
    if aggregation == "token":
        shares = [sum(sum(s.loss_mask) for s in c) for c in chunks]
    else:
        shares = [sum(1 for s in c if any(s.loss_mask)) for c in chunks]
    total = max(sum(shares), 1)
    return [(chunk, share / total) for chunk, share in zip(chunks, shares)]


def warm_up(optimizer: torch.optim.Optimizer, base_lrs: Sequence[float], warmup_steps: int) -> float:
    """Scale the learning rates for the coming step; returns the first set's. Adam's first
    steps move every weight by the full rate whatever its gradient's size (m/sqrt(v) is a sign at
    step 1), so on a noisy first batch a fresh optimizer takes its largest steps."""
    first = optimizer.param_groups[0]["params"][0]
    done = int(optimizer.state.get(first, {}).get("step", 0))
    scale = min(1.0, (done + 1) / warmup_steps) if warmup_steps else 1.0
    for params, base in zip(optimizer.param_groups, base_lrs):
        params["lr"] = base * scale
    return optimizer.param_groups[0]["lr"]


__all__ = ["Heads", "Learner", "Loss", "Reference", "Stepping", "microbatches", "plan", "warm_up"]
