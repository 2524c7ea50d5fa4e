"""Bounded, predictable memory for the update: the microbatches a memory budget holds.

An update's peak memory is what the process holds before it (the model, the LoRAs and their
optimizers, the interpreter: measured when the trainer is built, as the resident set on a CPU or
torch's allocation on a GPU) plus what
autograd keeps for the backward pass of one microbatch. That grows with the microbatch's padded
tokens (rows × length: every layer's inputs, norms, MLP activations) and, under eager attention,
with rows × length² (every layer keeps each head's [length, length] attention weights). The
two coefficients are per layer and per hidden unit or head, measured on the default model by
`bench/memory.py` (docs/memory.md), and scaled to another model by its shape.

`TrainerConfig(max_memory_gb=...)` then cuts each minibatch, sorted by length, into the largest
microbatches whose estimate stays within the budget, instead of running out of memory; a
budget that cannot hold one sequence of `max_seq_len` tokens is refused when the trainer starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Sequence

from forge_bridge.core.errors import InvalidArgument

if TYPE_CHECKING:
    import torch

GiB = 2 ** 30
LINEAR_BYTES = 120.0
"""Bytes kept per padded token, per layer and per hidden unit (bench/memory.py on the default model
with bf16 autocast measured 58–118; the largest, rounded up: a budget must not be overrun)."""
ATTENTION_BYTES = 6.0
"""Bytes kept per (row, position, position), per layer and per head under eager attention
(bench/memory.py: eager minus sdpa at 1,024 tokens, 5.5; 0 under sdpa's fused kernel)."""
CHECKPOINT_BYTES = 60.0
"""Under activation checkpointing: bytes kept per padded token, per layer and per hidden unit
beyond one layer's recompute (bench/memory.py measured 31–59; the largest, rounded up)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """An update's peak memory: resident + rows · length · (linear + quadratic · length), the
    quadratic term only for batches of at most `eager_up_to` tokens (eager attention)."""

    resident_gb: float
    """What the process holds before the update."""
    linear: float
    """Bytes per padded token of a microbatch."""
    quadratic: float
    """Bytes per (row, position, position) of a microbatch under eager attention."""
    eager_up_to: int = 1 << 30
    """The longest batch that runs eager attention (longer ones: sdpa, no quadratic term)."""

    @classmethod
    def for_model(cls, config, resident_gb: float, eager_up_to: int, checkpointing: bool = False
                  ) -> "MemoryEstimate":
        """The estimate for a transformers model config (layers, hidden size, heads); under
        activation checkpointing each layer keeps only its input, and one layer is recomputed at
        a time."""
        layers, hidden = config.num_hidden_layers, config.hidden_size
        attention = ATTENTION_BYTES * config.num_attention_heads
        if checkpointing:
            return cls(resident_gb, (CHECKPOINT_BYTES * layers + LINEAR_BYTES) * hidden, attention, eager_up_to)
        return cls(resident_gb, LINEAR_BYTES * layers * hidden, attention * layers, eager_up_to)

    def per_row_gb(self, length: int) -> float:
        quadratic = self.quadratic * length if length <= self.eager_up_to else 0.0
        return length * (self.linear + quadratic) / GiB

    def peak_gb(self, rows: int, length: int) -> float:
        """The estimated peak of one microbatch of `rows` sequences padded to `length` tokens."""
        return self.resident_gb + rows * self.per_row_gb(length)

    def rows_that_fit(self, budget_gb: float, length: int) -> int:
        """The most sequences of `length` tokens one microbatch may hold within the budget (0: none)."""
        per_row = self.per_row_gb(length)
        return max(0, int((budget_gb - self.resident_gb) // per_row)) if per_row > 0 else 1 << 30

    def check(self, budget_gb: float, max_seq_len: int) -> None:
        """Refuse a budget below one sequence of `max_seq_len` tokens, naming the fix."""
        if self.rows_that_fit(budget_gb, max_seq_len) < 1:
            need = self.peak_gb(1, max_seq_len)
            raise InvalidArgument(
                f"max_memory_gb={budget_gb:g} holds no microbatch of one sequence of max_seq_len={max_seq_len} "
                f"tokens: the process holds {self.resident_gb:.1f} GiB before the update and one such "
                f"sequence needs about {need:.1f} GiB in all; raise max_memory_gb to {math.ceil(need + 0.25)}, "
                "lower max_seq_len, or turn on gradient_checkpointing")


def chunk_by_budget(lengths: Sequence[int], estimate: MemoryEstimate, budget_gb: float) -> list[list[int]]:
    """Indices into `lengths` (sorted ascending) in consecutive chunks, each as large as the budget
    holds when padded to its longest sequence. A sequence alone over the budget is an error."""
    chunks: list[list[int]] = []
    for i, length in enumerate(lengths):
        if chunks and estimate.rows_that_fit(budget_gb, length) >= len(chunks[-1]) + 1:
            chunks[-1].append(i)
        elif estimate.rows_that_fit(budget_gb, length) >= 1:
            chunks.append([i])
        else:
            estimate.check(budget_gb, length)
    return chunks


def budget_chunker(model: Any, model_config: Any, config: Any, device: Any, eager_up_to: int
                   ) -> Callable[[list[int]], list[list[int]]] | None:
    """`config.optimizer.max_memory_gb` as a chunker of sorted sequence lengths for `learner.microbatches`,
    checked now against one sequence of `max_seq_len` tokens (an impossible budget is refused
    before any rollout); None without a budget."""
    if config.optimizer.max_memory_gb is None:
        return None
    import torch

    with torch.no_grad():  # every weight touched once: memory-mapped weights count from here on
        model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=device))
    estimate = MemoryEstimate.for_model(model_config, resident_gb(device), eager_up_to, config.optimizer.gradient_checkpointing)
    estimate.check(config.optimizer.max_memory_gb, config.max_seq_len)
    return partial(chunk_by_budget, estimate=estimate, budget_gb=config.optimizer.max_memory_gb)


def resident_gb(device: str | torch.device = "cpu") -> float:
    """What the process holds now: on a CUDA device the memory torch allocated there; else the
    resident set (Linux: /proc; elsewhere the peak so far)."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.memory_allocated(device) / GiB
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GiB
    except (OSError, ValueError, IndexError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (GiB if sys.platform == "darwin" else 2 ** 20)


__all__ = ["ATTENTION_BYTES", "CHECKPOINT_BYTES", "LINEAR_BYTES", "MemoryEstimate", "budget_chunker", "chunk_by_budget",
           "resident_gb"]
