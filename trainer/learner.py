"""The model being trained: the base with a LoRA per policy slot, their optimizers, any heads
trained beside them (PPO's value head), and scoring (log-probabilities of a batch's tokens).

Every update, whatever the algorithm, goes through one `Learner`: it knows the device, the
precision, the attention a batch length runs best with, the shared-prefix pass, and the memory
budget's microbatches (`chunker`). It holds no run state: the run folder, the reference and the
publisher are parts of their own.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Sequence

import torch

from forge_bridge.policies.base import DEFAULT_SLOT
from forge_bridge.policies.device import autocast, bf16_supported
from forge_bridge.trainer import memory
from forge_bridge.trainer.batch import Sample, collate
from forge_bridge.trainer.config import TrainerConfig
from forge_bridge.trainer.logprobs import EAGER_MAX_LEN, choose_attention, token_logprobs
from forge_bridge.trainer.lora import adapter_parameters, attach_lora, is_lora
from forge_bridge.trainer.update import Stepping

Heads = Callable[[int], dict[str, tuple[torch.nn.Module, float]]]
"""hidden size -> {name: (a module trained beside the LoRA, its learning rate)}."""


class Learner:
    """The base model with a LoRA per slot (`slots[0]` the shared one), an optimizer per LoRA,
    the heads, and how a batch is scored."""

    def __init__(self, source: str, config: TrainerConfig, slots: Sequence[str], device: str,
                 heads: Heads | None = None) -> None:
        from forge_bridge.policies import models

        self.config = config
        base, self.tokenizer = models.load(source)
        self.pad_id: int = self.tokenizer.pad_token_id or 0
        """What collated batches are padded with (masked out wherever it lands)."""
        self.device = device
        """Where the model, the batches and the optimizer state live."""
        base.to(device)
        self.eager_up_to = EAGER_MAX_LEN if str(device) == "cpu" and hasattr(base, "set_attn_implementation") else 0
        """Batches up to this many tokens run eager attention (see `attention`); 0: the model's own."""
        if self.eager_up_to:
            base.set_attn_implementation("eager")
        if config.gradient_checkpointing:
            base.activation_checkpointing_enable({"use_reentrant": False})
        self.share_prefix = not config.gradient_checkpointing
        """Whether a microbatch's shared token prefix runs once (not under activation checkpointing,
        nor once FSDP2 shards the model: ranks would make different numbers of collective calls)."""
        self.slots = list(slots)
        """The LoRAs trained, by policy slot: the shared one first, then one per role slot."""
        self.model = attach_lora(base, config.lora_rank, config.lora_alpha, config.lora_targets,
                                 extra_adapters=self.slots[1:], seed=config.seed)
        self.bf16 = bf16_supported(device) if config.bf16 is None else config.bf16
        made = heads(base.config.hidden_size) if heads else {}
        self.heads: dict[str, torch.nn.Module] = {name: module.to(device) for name, (module, _) in made.items()}
        """Modules trained beside the LoRA (PPO's value head), by name; shared by every slot."""
        self.head_lrs = {name: lr for name, (_, lr) in made.items()}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.group_names: dict[str, list[str]] = {}
        """Slot -> the names of its optimizer's parameter groups ('0': the LoRA, then the heads)."""
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
        role's adapter or state), with its parameter groups' names and rates."""
        groups = [{"params": adapter_parameters(self.model, slot), "lr": self.config.lr, "name": "0"}]
        groups += [{"params": list(module.parameters()), "lr": self.head_lrs[name], "name": name}
                   for name, module in self.heads.items()]
        self.group_names[slot] = [g.pop("name") for g in groups]
        self.optimizers[slot] = torch.optim.AdamW(groups)
        self.base_lrs[slot] = [g["lr"] for g in self.optimizers[slot].param_groups]

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer of the LoRA being trained now (the shared one outside an update)."""
        return self.optimizers[self.active_slot]

    def stepping(self) -> Stepping:
        """How the active slot's optimizer steps (`update.optimizer_step`), from the config."""
        c = self.config
        return Stepping(self.optimizer, tuple(self.group_names[self.active_slot]),
                        tuple(self.base_lrs[self.active_slot]), c.grad_clip, c.warmup_steps,
                        c.microbatch_size, c.loss_aggregation)

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

    def score(self, batch: dict, with_entropy: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logp [B, T], hidden [B, T, H], entropy) of the batch under the model being trained, at
        each sample's sampling temperature."""
        self.attention(batch["input_ids"].shape[1])
        with self.autocast():
            return token_logprobs(self.model, batch["input_ids"], batch["attention_mask"],
                                  batch["loss_mask"], with_entropy, batch["temperature"],
                                  share_prefix=self.share_prefix, body=self.bodies.get(self.active_slot))

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


__all__ = ["Heads", "Learner"]
