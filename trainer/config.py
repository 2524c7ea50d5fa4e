"""Trainer configs: frozen dataclasses, validated on creation. A trainer config nests the settings
of each concern (trainer/settings.py) and reads their flat names too."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass, replace

from forge_bridge.core.deprecated import renamed_keyword
from forge_bridge.trainer.settings import (
    Frozen,
    LoRAConfig,
    LossConfig,
    OptimizerConfig,
    RolloutConfig,
    RunConfig,
    check,
    count,
    number,
)


@dataclass(frozen=True)
class Distributed:
    """The update spread over processes, one per device (torchrun or Ray Train start them; docs/scale.md)."""

    strategy: str = "ddp"
    """'ddp' (every process holds the model; gradients all-reduced) or 'fsdp' (FSDP2 `fully_shard`:
    each process holds a shard of every layer's weights, gradients and optimizer state)."""
    backend: str = "auto"
    """torch.distributed backend when this process group is started here: 'auto' (nccl on CUDA,
    else gloo), 'gloo' or 'nccl'."""
    offload: bool = False
    """FSDP2 only: keep the sharded parameters on the CPU between uses (a GPU's memory lever)."""
    timeout_s: float = 86400.0
    """How long a rank waits on the others when this process group is started here: the other
    ranks wait out the leader's rollouts (and warm start) each iteration, so hours, not torch's
    default 30 minutes. Ray Train starts its own group: give it `TorchConfig(timeout_s=...)`."""

    def __post_init__(self) -> None:
        check(self.strategy in ("ddp", "fsdp"), "strategy", "'ddp' or 'fsdp'", self.strategy)
        check(self.backend in ("auto", "gloo", "nccl"), "backend", "'auto', 'gloo' or 'nccl'", self.backend)
        check(isinstance(self.offload, bool), "offload", "a bool", self.offload)
        check(not self.offload or self.strategy == "fsdp", "offload", "False with strategy 'ddp'", self.offload)
        check(number(self.timeout_s) and self.timeout_s > 0, "timeout_s", "a number of seconds > 0", self.timeout_s)


FLAT_NAMES: dict[str, tuple[str, str]] = {
    **{name: ("rollout", name) for name in ("group_size", "tasks_per_iteration", "concurrency", "success_threshold",
                                            "max_staleness")},
    **{name: ("optimizer", name) for name in ("lr", "epochs", "minibatch_size", "microbatch_size", "warmup_steps",
                                              "grad_clip", "max_memory_gb", "device", "bf16", "gradient_checkpointing")},
    "lora_rank": ("lora", "rank"), "lora_alpha": ("lora", "alpha"), "lora_targets": ("lora", "targets"),
    "role_slots": ("lora", "role_slots"),
    **{name: ("loss", name) for name in ("clip_low", "clip_high", "tis_cap", "kl_beta")},
    "loss_aggregation": ("loss", "aggregation"),
    "run_name": ("run", "name"), "out_dir": ("run", "out_dir"), "seed": ("run", "seed"), "progress": ("run", "progress"),
    "report_to": ("run", "report_to"),
}
"""The flat names of TrainerConfig's settings (`GRPOConfig(lr=3e-4)`, `config.lr`) -> (part, field):
they keep working beside the nested form (`GRPOConfig(optimizer=OptimizerConfig(lr=3e-4))`)."""


def an(kind: type) -> str:
    """'a RunConfig', 'an OptimizerConfig'."""
    return f"{'an' if kind.__name__[0] in 'AEIOU' else 'a'} {kind.__name__}"


class _Nested(type):
    """Builds a config from nested parts, flat names (applied on top of the part given, or of its
    default) or plain dicts for a part (as `to_dict` writes them)."""

    def __call__(cls, *args, **kwargs):
        parts = getattr(cls, "__dataclass_fields__", {})
        flat: dict[str, dict] = {}
        for name in [n for n in kwargs if n in FLAT_NAMES]:
            part, field = FLAT_NAMES[name]
            flat.setdefault(part, {})[field] = kwargs.pop(name)
        for part, kind in PARTS.items():
            if part not in parts or (part not in kwargs and part not in flat):
                continue
            given = kwargs.get(part, parts[part].default)
            if isinstance(given, Mapping):
                given = kind(**_tuples(given))
            if part in flat:
                check(isinstance(given, kind), part, an(kind), given)
                given = replace(given, **flat[part])
            kwargs[part] = given
        return super().__call__(*args, **kwargs)


@dataclass(frozen=True)
class TrainerConfig(metaclass=_Nested):
    """Settings shared by GRPO and PPO, nested by concern; every flat name of `FLAT_NAMES` works too."""

    rollout: RolloutConfig = RolloutConfig()
    """How each iteration's episodes are collected."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """The optimizer step: rate, batch, memory and device."""
    lora: LoRAConfig = LoRAConfig()
    """The adapters trained."""
    loss: LossConfig = LossConfig()
    """The policy objective's clipping, importance weights, KL and aggregation."""
    run: RunConfig = RunConfig()
    """The run's name, folder, seed, progress bars and trackers."""
    gamma: float = 0.95
    """Discount over the model calls of a trajectory: G_t = r_t + gamma * G_{t+1}."""
    span_weight: float = 1.0
    """Weight of span rewards (`Episode.span_reward`) added to their tokens' advantages, after
    PPO's whitening and as recorded there, centred only by GRPO's `span_baseline` (0: ignore them)."""
    max_seq_len: int = 1024
    """Longest training sequence; longer ones are truncated and counted."""
    merge_steps: bool = True
    """Train consecutive calls whose prompt continues the previous call's prompt and completion
    token for token as one sequence (each step's advantage on its own tokens, the tool results in
    between untrained): the loss and gradients of one sequence per call, the history encoded once
    (`test_merged_steps_give_the_per_step_loss_and_gradients_for_fewer_tokens`; tokens and seconds:
    bench/merge.py). A call that does not continue (a front end that re-serialised the history)
    starts a sequence of its own. Minibatches count calls, so merging leaves the optimizer steps
    as they were. Token aggregation only: `aggregation='sequence'` averages a sequence as one."""
    skip_uniform_groups: bool | None = None
    """GRPO with the group baseline: leave out groups whose every advantage is 0 and whose span
    rewards do not differ (no signal against their own group). None: skip them only without a KL
    term (`kl_beta` 0), where their loss is 0; with one, they hold their prompts near the reference."""
    distributed: Distributed | None = None
    """Spread the update over the processes torchrun or Ray Train started (None: this process alone)."""

    def __post_init__(self) -> None:
        for part, kind in PARTS.items():
            if part in self.__dataclass_fields__ and part not in ("guidance", "distributed"):
                check(isinstance(getattr(self, part), kind), part, an(kind), getattr(self, part))
        check(self.distributed is None or isinstance(self.distributed, Distributed), "distributed",
               "None or a Distributed(...)", self.distributed)
        check(number(self.gamma) and 0 <= self.gamma <= 1, "gamma", "a number in [0, 1]", self.gamma)
        check(number(self.span_weight) and 0 <= self.span_weight < math.inf, "span_weight",
               "a finite number >= 0", self.span_weight)
        check(count(self.max_seq_len, 1), "max_seq_len", "an int >= 1", self.max_seq_len)
        check(isinstance(self.merge_steps, bool), "merge_steps", "a bool", self.merge_steps)
        check(not (self.merge_steps and self.loss.aggregation == "sequence"), "merge_steps",
              "False with loss aggregation='sequence' (a merged sequence would be averaged as one call)",
              self.merge_steps)
        check(self.skip_uniform_groups is None or isinstance(self.skip_uniform_groups, bool), "skip_uniform_groups",
              "a bool or None", self.skip_uniform_groups)

    def __getattr__(self, name: str):
        """A flat name (`config.lr`) reads its part's field (`config.optimizer.lr`)."""
        where = FLAT_NAMES.get(name)
        if where is None:
            raise AttributeError(f"{type(self).__name__} has no setting {name!r}")
        return getattr(object.__getattribute__(self, where[0]), where[1])

    def to_dict(self) -> dict:
        """The settings as JSON-ready values, nested as the config is (`from_dict` reads them back)."""
        return _plain(self)

    @classmethod
    def from_dict(cls, data: Mapping):
        """The config `to_dict` wrote (lists read back as tuples)."""
        return cls(**{k: _tuples(v) for k, v in data.items()})


def _plain(value):
    """A config as JSON-ready values: dataclasses and mappings as dicts, tuples as lists."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, os.PathLike) else value


def _tuples(value):
    """JSON lists back as tuples, inside dicts too."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _tuples(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Guidance:
    """Guide trajectories in GRPO groups the policy fails (LUFFY, arXiv 2504.14945)."""

    below: float = 0.0
    """A group is guided when its on-policy success rate is at or below this."""
    k: int = 2
    """Guide trajectories added to such a group."""
    source: str = "demonstrations"
    """'demonstrations' (the teacher's recorded ones of the same task) or 'teacher' (the teacher's
    rollouts of the task through the same agent, recorded like the student's)."""
    shaping: float = 0.1
    """The constant c of the guide tokens' weight f(pi) = pi / (pi + c), in place of the clipped ratio."""

    def __post_init__(self) -> None:
        check(number(self.below) and 0 <= self.below <= 1, "below", "a success rate in [0, 1]", self.below)
        check(count(self.k, 1), "k", "an int >= 1", self.k)
        check(self.source in ("demonstrations", "teacher"), "source", "'demonstrations' or 'teacher'", self.source)
        check(number(self.shaping) and self.shaping > 0, "shaping", "a number > 0", self.shaping)


PARTS = {"rollout": RolloutConfig, "optimizer": OptimizerConfig, "lora": LoRAConfig, "loss": LossConfig,
         "run": RunConfig, "guidance": Guidance, "distributed": Distributed}
"""The nested parts of the configs, by field name (a plain dict for one is read as that part)."""


@dataclass(frozen=True)
class GRPOConfig(TrainerConfig):
    """Multi-turn GRPO: an episode-level advantage plus a step-level one within anchor states."""

    credit: str = "anchor"
    """'anchor' (episode advantage + step advantage within groups of steps taken from the same
    state) or 'trajectory' (the episode advantage on every step: outcome-level GRPO)."""
    step_weight: float = 1.0
    """omega: weight of the step-level advantage added to the episode-level one ('anchor')."""
    scale_by_std: bool = True
    """Divide by the group's standard deviation (False: only subtract the mean, as Dr. GRPO)."""
    baseline: str = "group"
    """What a return is compared with: 'group' (GRPO: the other rollouts of the same task) or
    'batch' (every rollout of the iteration: a task that all rollouts failed, or all passed,
    still says which behaviour to leave or keep, against the other tasks)."""
    span_baseline: str = "none"
    """Span rewards as recorded ('none'), or each keyed one minus the mean over the rollouts compared
    of their value for its key, 0 where a rollout has none ('group': `centre_span_rewards`)."""
    guidance: Guidance | None = None
    """Add a teacher's guide trajectories to groups the policy fails (needs `GRPOTrainer(teacher=)`)."""
    distill_beta: float = 0.0
    """On-policy distillation: each sampled token's advantage gains distill_beta * (log pi_teacher -
    log pi_student), the reverse KL to the teacher as a per-token reward (0: off; needs a teacher
    that scores tokens in the student's vocabulary)."""
    relabel_weight: float = 0.0
    """DAgger: on steps of failed rollouts, the teacher's own action there is imitated, weighted
    by this against the policy-gradient terms (0: off)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.guidance is None or isinstance(self.guidance, Guidance), "guidance", "a Guidance or None",
               self.guidance)
        for name in ("distill_beta", "relabel_weight"):
            check(number(getattr(self, name)) and 0 <= getattr(self, name) < math.inf, name,
                   "a finite number >= 0", getattr(self, name))
        check(self.baseline in ("group", "batch"), "baseline", "'group' or 'batch'", self.baseline)
        check(self.span_baseline in ("none", "group"), "span_baseline", "'none' or 'group'", self.span_baseline)
        check(self.credit in ("anchor", "trajectory"), "credit", "'anchor' or 'trajectory'", self.credit)
        check(number(self.step_weight) and self.step_weight >= 0, "step_weight", "a number >= 0",
               self.step_weight)

    def teacher_settings(self) -> tuple[str, ...]:
        """The settings that ask for a teacher, as a user would write them (empty: none does)."""
        guide = (f"Guidance(source={self.guidance.source!r})",) if self.guidance else ()
        return guide + tuple(name for name in ("distill_beta", "relabel_weight") if getattr(self, name) > 0)


@dataclass(frozen=True)
class PPOConfig(TrainerConfig):
    """Multi-turn PPO: GAE over steps with a value head on the policy's hidden states."""

    lam: float = 0.95
    """GAE lambda."""
    value_coef: float = 0.5
    """Weight of the value loss; it trains only the head, whose gradient is clipped on its own, so
    under Adam this weight changes little."""
    value_lr: float = 0.05
    """Learning rate of the value head (from zero); Adam's first step moves a value by ~2x this."""
    normalize_advantages: bool = False
    """Whiten advantages over each iteration's batch (off by default: when most rollouts agree,
    whitening blows value-estimate noise up to unit-size advantages and the policy drifts)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(number(self.lam) and 0 <= self.lam <= 1, "lam", "a number in [0, 1]", self.lam)
        check(number(self.value_coef) and self.value_coef >= 0, "value_coef", "a number >= 0",
               self.value_coef)
        check(number(self.value_lr) and self.value_lr > 0, "value_lr", "a number > 0", self.value_lr)
        check(self.role_slots is None, "role_slots", "None with PPO (its value head is shared by "
               "every role; train per-role adapters with GRPO)", self.role_slots)
        check(self.distributed is None, "distributed", "None with PPO (a distributed update trains LoRAs "
               "only, not the value head; spread GRPO's)", self.distributed)


@dataclass(frozen=True)
class SFTConfig:
    """The supervised warm start on demonstrations (`fb.sft`)."""

    epochs: int = 4
    """Passes over the demonstrations (with `lr`, chosen by a sweep on the default model:
    docs/own-agent.md#the-warm-starts-defaults)."""
    lr: float = 1e-3
    """AdamW learning rate of the LoRA (the trainer's RL rate, 1e-4, leaves the default model
    where it was on a dozen demonstrations: the same sweep)."""
    batch_size: int | None = 8
    """Model calls per optimizer step (None: the trainer's `minibatch_size`); a merged sequence
    counts each call it holds (`GRPOConfig.merge_steps`)."""
    publish: bool = True
    """Publish the result to the live policy as version '<run>-sft'."""

    def __post_init__(self) -> None:
        check(count(self.epochs, 1), "epochs", "an int >= 1", self.epochs)
        check(number(self.lr) and self.lr > 0, "lr", "a number > 0", self.lr)
        check(self.batch_size is None or count(self.batch_size, 1), "batch_size", "an int >= 1 or None",
              self.batch_size)
        check(isinstance(self.publish, bool), "publish", "a bool", self.publish)


WHERE_KEYS = frozenset({"task_id", "group_id", "version"})
"""The store filters `OfflineConfig.where` takes (`TrajectoryStore.iter`'s)."""


@dataclass(frozen=True)
class OfflineConfig:
    """Training from the store (`train_offline`): which episodes, and how each kind is learned from."""

    since: float | None = None
    """Only episodes recorded at or after this unix time (None: all)."""
    run_id: str | None = None
    """Only episodes of this run id (None: every run in the store)."""
    where: Mapping[str, str] | None = None
    """More store filters every episode must match: `task_id`, `group_id`, `version` (the version that served it)."""
    threshold: float = 1.0
    """An episode whose reward is at least this is a good one: its steps are imitated."""
    imitate: bool = True
    """Imitate the good episodes that are not the student's own samples (upstream, demonstration)."""
    reinforce: bool = True
    """Policy gradient on the student's own recorded episodes, against the batch's mean reward."""
    sft: SFTConfig = SFTConfig(epochs=2, lr=1e-3, publish=False)
    """The imitation's passes and rate (it never publishes on its own: the iteration does)."""
    publish: bool = True
    """Make the policy serve the result at once (False: save it only, for a gate to decide: `Promotion.consider`)."""

    def __post_init__(self) -> None:
        check(self.since is None or number(self.since), "since", "None or a unix time", self.since)
        check(self.run_id is None or isinstance(self.run_id, str), "run_id", "None or a run id", self.run_id)
        if isinstance(self.where, Mapping):  # `version`'s old name `adapter` still read, for one release
            object.__setattr__(self, "where", renamed_keyword("OfflineConfig.where", "adapter", "version",
                                                              dict(self.where), stacklevel=4))
        check(self.where is None or (isinstance(self.where, Mapping) and set(self.where) <= WHERE_KEYS
                                      and all(isinstance(v, str) for v in self.where.values())),
               "where", f"None or a dict of store filters ({', '.join(sorted(WHERE_KEYS))}) to strings", self.where)
        if self.where is not None:
            object.__setattr__(self, "where", Frozen(self.where))
        check(number(self.threshold) and math.isfinite(self.threshold), "threshold", "a finite number", self.threshold)
        for name in ("imitate", "reinforce", "publish"):
            check(isinstance(getattr(self, name), bool), name, "a bool", getattr(self, name))
        check(isinstance(self.sft, SFTConfig) and not self.sft.publish, "sft", "an SFTConfig with publish=False",
               self.sft)


__all__ = ["FLAT_NAMES", "PARTS", "Distributed", "GRPOConfig", "Guidance", "OfflineConfig", "PPOConfig", "SFTConfig",
           "TrainerConfig"]
