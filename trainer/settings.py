"""The settings of each concern a trainer config groups: rollouts, the optimizer step, the LoRA,
the loss and the run. Frozen dataclasses, validated on creation (trainer/config.py nests them)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from forge_bridge.core.errors import InvalidArgument
from forge_bridge.policies.device import check_device

TRACKERS = ("tensorboard", "wandb", "mlflow")
"""The trackers `RunConfig.report_to` takes (`trainer/trackers.py` reports to each)."""


def check(cond: bool, name: str, expected: str, value: object) -> None:
    if not cond:
        raise InvalidArgument(f"{name}: expected {expected}, got {value!r}")


_SLOT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Frozen(Mapping):
    """A read-only mapping for config fields (a dict is mutable; this hashes, compares equal to a
    dict with the same items, and pickles)."""

    def __init__(self, items=()) -> None:
        self._items = dict(items)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items.items())))

    def __repr__(self) -> str:
        return repr(self._items)


def count(value: object, least: int) -> bool:
    """An int (never a bool) of at least `least`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


@dataclass(frozen=True)
class RolloutConfig:
    """How each iteration's episodes are collected."""

    group_size: int = 8
    """Rollouts per task per iteration (GRPO's group)."""
    tasks_per_iteration: int | None = None
    """Tasks sampled for each iteration (None: all of them)."""
    concurrency: int = 8
    """Rollouts run at once (the embedded policy batches their model calls)."""
    success_threshold: float = 1.0
    """A rollout whose reward reaches this counts as a success (`core.types.succeeded`)."""
    max_staleness: int = 0
    """Versions a trained step may lag the update. 0: each iteration's rollouts run after the last
    update, on its version. k >= 1: the next iteration's rollouts run while this one updates, on
    the version served then (one behind), and a trajectory with a step served more than k
    versions before its update is left out and counted (`stale_dropped`); TIS weighs the rest."""

    def __post_init__(self) -> None:
        for name in ("group_size", "concurrency"):
            check(count(getattr(self, name), 1), name, "an int >= 1", getattr(self, name))
        check(count(self.max_staleness, 0), "max_staleness", "an int >= 0", self.max_staleness)
        check(self.tasks_per_iteration is None or count(self.tasks_per_iteration, 1), "tasks_per_iteration",
               "an int >= 1 or None", self.tasks_per_iteration)
        check(number(self.success_threshold) and math.isfinite(self.success_threshold), "success_threshold",
               "a finite number", self.success_threshold)


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer step: rate, batch, memory and device."""

    lr: float = 3e-4
    """AdamW learning rate for the LoRA (PPO's value head has its own, `value_lr`); measured on the
    demo and the template (docs/experiments/demo.md, docs/own-agent.md)."""
    epochs: int = 1
    """Passes over each iteration's samples."""
    minibatch_size: int = 64
    """Model calls per optimizer step (a merged sequence counts each call it holds). More than an iteration's samples: one step on all of them, so
    opposite pushes of two kinds of task on a decision they share cancel instead of taking turns
    (measured on the demo: docs/experiments/demo.md)."""
    microbatch_size: int | None = 8
    """Sequences per forward/backward pass, accumulated into the step (None: the whole minibatch)."""
    warmup_steps: int = 2
    """Optimizer steps over which the learning rate rises linearly to `lr` (0: none): a fresh Adam's
    first steps are its largest, whatever the gradient's size."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    max_memory_gb: float | None = None
    """Peak memory the update may reach: each minibatch is cut into the largest microbatches that
    fit (trainer/memory.py; `microbatch_size` still caps them). None: `microbatch_size` alone."""
    device: str = "auto"
    """Where the update runs: 'auto' (CUDA, then MPS, then CPU), 'cpu', 'cuda', 'cuda:N' or 'mps'."""
    bf16: bool | None = None
    """bf16 autocast for the update (None: where the device computes bf16 fast)."""
    gradient_checkpointing: bool = False
    """Recompute the decoder's activations in the backward pass: less memory, more time."""

    def __post_init__(self) -> None:
        for name in ("epochs", "minibatch_size"):
            check(count(getattr(self, name), 1), name, "an int >= 1", getattr(self, name))
        check(self.microbatch_size is None or count(self.microbatch_size, 1), "microbatch_size",
               "an int >= 1 or None", self.microbatch_size)
        check(count(self.warmup_steps, 0), "warmup_steps", "an int >= 0", self.warmup_steps)
        check(number(self.lr) and self.lr > 0, "lr", "a number > 0", self.lr)
        check(number(self.grad_clip) and self.grad_clip > 0, "grad_clip", "a number > 0", self.grad_clip)
        check(self.max_memory_gb is None or (number(self.max_memory_gb) and self.max_memory_gb > 0),
               "max_memory_gb", "a number > 0 (GiB) or None", self.max_memory_gb)
        check_device(self.device)
        check(self.bf16 is None or isinstance(self.bf16, bool), "bf16", "a bool or None", self.bf16)
        check(isinstance(self.gradient_checkpointing, bool), "gradient_checkpointing", "a bool",
               self.gradient_checkpointing)


@dataclass(frozen=True)
class LoRAConfig:
    """The adapters trained: their shape, and which crew roles get one of their own."""

    rank: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA alpha (scale = alpha / rank)."""
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Module names that get LoRA."""
    role_slots: Mapping[str, str] | None = None
    """Crew role -> policy slot: each slot named here gets a LoRA of its own, trained only on its
    roles' trajectories (own advantages, optimizer, checkpoints) and published to that slot, as
    `ForgeLLM(role_slot=...)` serves it (None: one LoRA shared by every role, in the default slot).
    A dict is taken and kept read-only."""

    def __post_init__(self) -> None:
        for name in ("rank", "alpha"):
            check(count(getattr(self, name), 1), f"lora_{name}", "an int >= 1", getattr(self, name))
        check(isinstance(self.targets, tuple) and all(isinstance(t, str) for t in self.targets)
               and len(self.targets) > 0, "lora_targets", "a non-empty tuple of module names", self.targets)
        if self.role_slots is not None:
            check(isinstance(self.role_slots, Mapping) and bool(self.role_slots) and all(
                isinstance(k, str) and k and isinstance(v, str) and _SLOT.match(v)
                for k, v in self.role_slots.items()), "role_slots",
                "a non-empty dict of role -> slot name (letters, digits, - and _)", self.role_slots)
            object.__setattr__(self, "role_slots", Frozen(self.role_slots))


@dataclass(frozen=True)
class LossConfig:
    """The policy objective's settings (`losses.policy_objective`)."""

    clip_low: float = 0.2
    """Lower clip of the importance ratio: 1 - clip_low."""
    clip_high: float = 0.2
    """Upper clip of the importance ratio: 1 + clip_high (asymmetric clipping when different)."""
    tis_cap: float | None = 2.0
    """Truncated importance sampling: each token weighted by min(pi_old / pi_sampler, tis_cap), for
    the sampler (vLLM in bf16, a batched embedded policy) not matching the trainer (None: off)."""
    kl_beta: float = 0.1
    """Weight of the k3 KL to the reference (the base model, or what `freeze_reference` froze after a
    warm start: measured on the demo and the template); 0 skips it and its forward pass."""
    aggregation: str = "token"
    """'token' (every trained token weighs the same) or 'sequence' (each sequence the same)."""

    def __post_init__(self) -> None:
        for name in ("clip_low", "clip_high"):
            value = getattr(self, name)
            check(number(value) and 0 < value < 1, name, "a number in (0, 1)", value)
        check(self.tis_cap is None or (number(self.tis_cap) and self.tis_cap >= 1), "tis_cap",
               "None or a number >= 1", self.tis_cap)
        check(number(self.kl_beta) and self.kl_beta >= 0, "kl_beta", "a number >= 0", self.kl_beta)
        check(self.aggregation in ("token", "sequence"), "loss_aggregation", "'token' or 'sequence'",
               self.aggregation)


@dataclass(frozen=True)
class RunConfig:
    """The run: its name, folder, seed and what it shows, and where its metrics go."""

    name: str = "run"
    """Adapter versions are published as '<name>-v<N>'."""
    out_dir: str = "runs/train"
    """Run folder: adapters, checkpoints, metrics.jsonl, TensorBoard logs, trajectories.db."""
    seed: int = 0
    """Seed for task sampling, shuffling, initialisation and the rollouts' sampling (each rollout
    gets its own seed, so a rerun samples the same rollouts whatever the thread timing)."""
    progress: bool = True
    """Show progress bars."""
    report_to: tuple[str, ...] = ("tensorboard",)
    """Trackers that get every metric and the config besides metrics.jsonl: 'tensorboard', 'wandb', 'mlflow'."""

    def __post_init__(self) -> None:
        check(isinstance(self.name, str) and self.name.replace("-", "").replace("_", "").isalnum(),
               "run_name", "letters, digits, - and _", self.name)
        check(isinstance(self.out_dir, (str, os.PathLike)), "out_dir", "a folder path", self.out_dir)
        check(count(self.seed, 0), "seed", "an int >= 0", self.seed)
        check(isinstance(self.progress, bool), "progress", "a bool", self.progress)
        if isinstance(self.report_to, str):  # one name, as Hugging Face's Trainer takes it
            object.__setattr__(self, "report_to", (self.report_to,))
        if isinstance(self.report_to, list):
            object.__setattr__(self, "report_to", tuple(self.report_to))
        check(isinstance(self.report_to, tuple) and all(t in TRACKERS for t in self.report_to)
              and len(set(self.report_to)) == len(self.report_to), "report_to",
              f"a tuple of distinct names from {', '.join(map(repr, TRACKERS))} (() for metrics.jsonl alone)",
              self.report_to)


__all__ = ["TRACKERS", "Frozen", "LoRAConfig", "LossConfig", "OptimizerConfig", "RolloutConfig", "RunConfig", "check", "count",
           "number"]
